// Host-only check (no GPU) of the gated CUTLASS GEMM's view of B (templates/cutlass/gemm.cu.j2, GatedMainloop): B is
// the K x 2N transpose of the concatenated gate and up weights (column-major, leading dimension ld), and CUTLASS's
// tile n of the M x 2N problem must hold, in its first tile-n rows of B^T, the gate's rows [n * h, (n + 1) * h) and,
// in its second, the up projection's rows N + [n * h, (n + 1) * h), h being the spec's tile n. The rendered kernel
// source is included (L2C_KERNEL_SOURCE); its main loop's gated_b and CUTLASS's local_tile give each element's
// offset, compared here with that arithmetic for several N, K and leading dimensions. Prints one line per case and
// exits non-zero on a failure.
#include L2C_KERNEL_SOURCE

#include <cstdio>
#include <vector>

int main() {
  using namespace cute;
  using Element = typename CollectiveMainloop::InternalElementB;
  constexpr int kTileN = size<1>(TileShape{});   // CUTLASS's: twice the spec's tile n
  constexpr int kTileK = size<2>(TileShape{});
  constexpr int h = kTileN / 2;
  bool ok = true;
  int const cases[][3] = {{h, kTileK, kTileK}, {3 * h, 2 * kTileK, 2 * kTileK + 8}, {5 * h, 3 * kTileK, 3 * kTileK}};
  for (auto const& c : cases) {
    int const N = c[0], K = c[1], ld = c[2];
    std::vector<Element> weight(size_t(2) * N * ld);
    Element const* base = weight.data();
    typename CollectiveMainloop::StrideB dB{ld, Int<1>{}, int64_t(0)};
    auto b = CollectiveMainloop::gated_b(base, 2 * N, K, 1, dB);
    auto tiles = local_tile(b, TileShape{}, make_coord(_, _, _), Step<Underscore, _1, _1>{});   // (n, k, tile n, tile k, l)
    bool case_ok = size<2>(tiles) == N / h && size<3>(tiles) == K / kTileK;
    for (int tn = 0; tn < N / h && case_ok; ++tn) {
      for (int tk = 0; tk < K / kTileK; ++tk) {
        for (int r = 0; r < kTileN; ++r) {
          int64_t const row = r < h ? int64_t(tn) * h + r : int64_t(N) + int64_t(tn) * h + (r - h);
          for (int k = 0; k < kTileK; ++k) {
            int64_t const offset = &tiles(r, k, tn, tk, 0) - base;
            if (offset != row * ld + int64_t(tk) * kTileK + k) {
              case_ok = false;
            }
          }
        }
      }
    }
    std::printf("tile n %d (of B: %d), N %d, K %d, ld %d: %s\n", h, kTileN, N, K, ld, case_ok ? "ok" : "FAILED");
    ok = ok && case_ok;
  }
  return ok ? 0 : 1;
}
