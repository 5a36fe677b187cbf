// Host-only check (no GPU) of what l2c's staged epilogue (templates/cutlass/gemm.cu.j2, StagedEpilogue) assumes
// about the accumulators of the warpgroup MMAs CUTLASS's collective builder picks: over all consumer threads, the
// tile's every element is held exactly once; the values of MMA step `step` along M lie in rows
// [step * rows, (step + 1) * rows); and where the tile is staged in column halves, the first half of each thread's
// values lies in the first half of the columns (tiles 96, 128, 192 or 256 wide, which one MMA spans; 112, 144-176 and
// 208-240 take several MMAs along N), and value v + values / 2 lies in value v's row, half a tile further along N
// (the pair a gated tile's epilogue multiplies: the gate's column and the up projection's). Prints one line per
// configuration and exits non-zero on a failure.
#include <cstdio>
#include <vector>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"

template <int kTileM, int kTileN, class Schedule, class LayoutB>
bool check(char const* name) {
  constexpr bool cooperative = cute::is_same_v<Schedule, cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using namespace cute;
  using TileShape = Shape<Int<kTileM>, Int<kTileN>, _64>;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::half_t, cutlass::layout::RowMajor, 8,
      cutlass::half_t, LayoutB, 8, float, TileShape, Shape<_1, _1, _1>,
      cutlass::gemm::collective::StageCount<2>, Schedule>::CollectiveOp;
  using TiledMma = typename Mainloop::TiledMma;
  constexpr int kThreads = size(TiledMma{});
  constexpr int kRows = kTileM < (cooperative ? 128 : 64) ? kTileM : (cooperative ? 128 : 64);
  constexpr int kHalves = kTileN == 96 || kTileN == 128 || kTileN == 192 || kTileN == 256 ? 2 : 1;   // one MMA
  std::vector<int> seen(kTileM * kTileN, 0);
  bool ok = true;
  for (int t = 0; t < kThreads; ++t) {
    Tensor c = TiledMma{}.get_thread_slice(t).partition_C(make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{})));
    int const values = size<0>(c);
    if (size<1>(c) * kRows != kTileM || (kHalves == 2 && (size<2>(c) != 1 || values % 2))) ok = false;
    for (int v = 0; v < values; ++v) {
      for (int step = 0; step < size<1>(c); ++step) {
        for (int q = 0; q < size<2>(c); ++q) {
          int const m = get<0>(c(v, step, q)), n = get<1>(c(v, step, q));
          seen[m * kTileN + n] += 1;
          if (m / kRows != step) ok = false;
          if (kHalves == 2 && n / (kTileN / 2) != v / (values / 2)) ok = false;
          if (kHalves == 2 && v < values / 2 &&
              (get<0>(c(v + values / 2, step, q)) != m || get<1>(c(v + values / 2, step, q)) != n + kTileN / 2)) {
            ok = false;
          }
        }
      }
    }
  }
  for (int x : seen) ok = ok && x == 1;
  std::printf("%s %dx%d threads=%d rows=%d halves=%d %s\n", name, kTileM, kTileN, kThreads, kRows, kHalves,
              ok ? "ok" : "FAILED");
  return ok;
}

int main() {
  using Coop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using Ping = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using Basic = cutlass::gemm::KernelTmaWarpSpecialized;
  using Col = cutlass::layout::ColumnMajor;
  using Row = cutlass::layout::RowMajor;
  bool ok = true;
  ok &= check<128, 256, Coop, Col>("cooperative");
  ok &= check<256, 128, Coop, Row>("cooperative");
  ok &= check<128, 192, Coop, Col>("cooperative");
  ok &= check<256, 256, Coop, Col>("cooperative");
  ok &= check<128, 16, Coop, Col>("cooperative");
  ok &= check<128, 128, Ping, Col>("pingpong");
  ok &= check<64, 256, Ping, Row>("pingpong");
  ok &= check<64, 192, Ping, Col>("pingpong");
  ok &= check<128, 64, Ping, Row>("pingpong");
  ok &= check<64, 48, Ping, Col>("pingpong");
  ok &= check<64, 8, Basic, Col>("basic");
  ok &= check<64, 24, Basic, Row>("basic");
  ok &= check<128, 256, Basic, Col>("basic");
  ok &= check<128, 16, Basic, Row>("basic");
  ok &= check<128, 128, Basic, Col>("basic");
  ok &= check<256, 64, Coop, Row>("cooperative");
  ok &= check<128, 208, Coop, Col>("cooperative");
  ok &= check<128, 224, Coop, Row>("cooperative");
  ok &= check<128, 240, Coop, Col>("cooperative");
  ok &= check<64, 208, Ping, Col>("pingpong");
  ok &= check<64, 224, Basic, Row>("basic");
  ok &= check<64, 240, Basic, Col>("basic");
  ok &= check<128, 96, Coop, Row>("cooperative");
  ok &= check<64, 96, Ping, Col>("pingpong");
  ok &= check<64, 128, Basic, Row>("basic");
  ok &= check<64, 160, Basic, Col>("basic");
  return ok ? 0 : 1;
}
