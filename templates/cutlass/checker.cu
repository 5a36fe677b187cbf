// l2c's verification checker (l2c/checker.py): fresh normal inputs and the comparison of a kernel's output with a
// float32 reference, computed on the GPU by l2c's own small kernels. Verifying a prebuilt kernel on a user's calling
// thread with torch's operators loads a dozen of torch's kernels for the first time, 15-50 ms each on the H200;
// this library loads in about a millisecond.
//
// Every entry point runs on the given stream and returns a cudaError_t (0: success).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

enum DType { F16 = 0, BF16 = 1, F32 = 2 };
enum BiasMode { BIAS_NONE = 0, BIAS_ROW = 1, BIAS_COL = 2 };

constexpr int TILE = 64;      // output tile of one block of the comparison
constexpr int DEPTH = 16;     // K slab staged in shared memory per step
constexpr int THREADS = 256;  // 16 x 16 threads, 4 x 4 outputs each

struct Totals {                   // what the comparison accumulates (read back by l2c/checker.py)
  unsigned long long worst;       // (bits of the largest |out - ref| / bound) << 32 | its row-major index
  unsigned long long nan_count;   // outputs that are NaN
  unsigned long long first_nan;   // the smallest row-major index of a NaN output
  unsigned long long nonfinite;   // outputs or references that are infinite
  double diff2, ref2, bound2;     // sums of squares over all outputs
};

__device__ __forceinline__ float load(const void* p, int64_t i, int t) {
  if (t == F16) return __half2float(static_cast<const __half*>(p)[i]);
  if (t == BF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

__device__ __forceinline__ void store(void* p, int64_t i, int t, float v) {
  if (t == F16) static_cast<__half*>(p)[i] = __float2half_rn(v);
  else if (t == BF16) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else static_cast<float*>(p)[i] = v;
}

__device__ __forceinline__ uint64_t mix(uint64_t z) {   // splitmix64's finaliser
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Element i of a fill drawn from `seed`: with density <= 0 a Normal(0, 1) value (Box-Muller on two 24-bit uniforms
// drawn from a hash of the seed and the index); else -1, 0 or 1, nonzero with probability `density`.
__device__ __forceinline__ float drawn(uint64_t seed, int64_t i, float density) {
  uint64_t r = mix(seed ^ mix((uint64_t)i));
  float u1 = (float)((r >> 40) + 1) * (1.0f / 16777216.0f);    // (0, 1]
  float u2 = (float)(r & 0xFFFFFFull) * (1.0f / 16777216.0f);  // [0, 1)
  if (density > 0.0f) return u1 <= density ? (u2 < 0.5f ? -1.0f : 1.0f) : 0.0f;
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

__global__ void fill(void* p, int64_t count, int t, uint64_t seed, float density) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
    store(p, i, t, drawn(seed, i, density));
}

__device__ __forceinline__ uint32_t bits(const void* p, int64_t i, int t) {
  if (t == F32) return static_cast<const uint32_t*>(p)[i];
  return static_cast<const uint16_t*>(p)[i];
}

// Counts the elements of `p` whose bits differ from what `fill` with the same arguments stored.
__global__ void count_changed(const void* p, int64_t count, int t, uint64_t seed, float density,
                              unsigned long long* changed) {
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t expected;
    if (t == F32) { float v = drawn(seed, i, density); expected = __float_as_uint(v); }
    else if (t == F16) expected = __half_as_ushort(__float2half_rn(drawn(seed, i, density)));
    else expected = __bfloat16_as_ushort(__float2bfloat16_rn(drawn(seed, i, density)));
    local += bits(p, i, t) != expected;
  }
  for (int offset = 16; offset > 0; offset >>= 1) local += __shfl_down_sync(0xffffffffu, local, offset);
  if ((threadIdx.x & 31) == 0 && local) atomicAdd(changed, local);
}

// Counts the bytes of `p` that are no longer the poison (0xFF).
__global__ void count_unpoisoned(const unsigned char* p, int64_t bytes, unsigned long long* changed) {
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < bytes; i += (int64_t)gridDim.x * blockDim.x)
    local += p[i] != 0xFF;
  for (int offset = 16; offset > 0; offset >>= 1) local += __shfl_down_sync(0xffffffffu, local, offset);
  if ((threadIdx.x & 31) == 0 && local) atomicAdd(changed, local);
}

unsigned grid_for(int64_t count) {
  int64_t blocks = (count + 255) / 256;
  return (unsigned)(blocks < 65536 ? blocks : 65536);
}

// Zero the device counter in `scratch`, run `launch`, read the counter into `result` (host): the stream synchronized.
template <typename Launch>
int counted(void* scratch, void* result, cudaStream_t s, Launch launch) {
  cudaError_t err = cudaMemsetAsync(scratch, 0, sizeof(unsigned long long), s);
  if (err != cudaSuccess) return (int)err;
  launch();
  if ((err = cudaGetLastError()) != cudaSuccess) return (int)err;
  err = cudaMemcpyAsync(result, scratch, sizeof(unsigned long long), cudaMemcpyDeviceToHost, s);
  if (err != cudaSuccess) return (int)err;
  return (int)cudaStreamSynchronize(s);
}

struct Operands {
  const void* a; int64_t a_row, a_col;   // element (i, k) at a[i * a_row + k * a_col]
  const void* b; int64_t b_row, b_col;   // element (k, j)
  const void* out; int64_t o_row, o_col;
  const void* bias; int bias_mode;
  int m, n, k, in_type, out_type;
};

struct Bound {                  // l2c.verify.element_bound for an exact-product, plain epilogue
  float alpha, u_out, sums, u_terms, safety, tiny;
};

__device__ void reduce_and_publish(Totals* totals, unsigned long long worst, unsigned long long nans,
                                   unsigned long long first_nan, unsigned long long nonfinite, double d2,
                                   double r2, double b2) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    worst = max(worst, __shfl_down_sync(0xffffffffu, worst, offset));
    nans += __shfl_down_sync(0xffffffffu, nans, offset);
    first_nan = min(first_nan, __shfl_down_sync(0xffffffffu, first_nan, offset));
    nonfinite += __shfl_down_sync(0xffffffffu, nonfinite, offset);
    d2 += __shfl_down_sync(0xffffffffu, d2, offset);
    r2 += __shfl_down_sync(0xffffffffu, r2, offset);
    b2 += __shfl_down_sync(0xffffffffu, b2, offset);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicMax(&totals->worst, worst);
    if (nans) atomicAdd(&totals->nan_count, nans);
    if (first_nan != ~0ull) atomicMin(&totals->first_nan, first_nan);
    if (nonfinite) atomicAdd(&totals->nonfinite, nonfinite);
    atomicAdd(&totals->diff2, d2);
    atomicAdd(&totals->ref2, r2);
    atomicAdd(&totals->bound2, b2);
  }
}

// The reference P = a @ b and the spread R = sqrt((a * a) @ (b * b)) of one 64 x 64 output tile in float32, then,
// per output, the epilogue's reference, its elementwise bound and the difference from `out`.
__global__ void __launch_bounds__(THREADS) compare(Operands op, Bound bd, Totals* totals) {
  __shared__ float as[DEPTH][TILE];
  __shared__ float bs[DEPTH][TILE];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int i0 = blockIdx.y * TILE, j0 = blockIdx.x * TILE;
  float acc[4][4] = {}, sq[4][4] = {};
  for (int k0 = 0; k0 < op.k; k0 += DEPTH) {
    for (int r = 0; r < TILE * DEPTH / THREADS; ++r) {
      int idx = tid + r * THREADS;
      int ii, kk;   // the faster-varying index along the operand's contiguous dimension
      if (op.a_col == 1) { kk = idx % DEPTH; ii = idx / DEPTH; } else { ii = idx % TILE; kk = idx / TILE; }
      int i = i0 + ii, k = k0 + kk;
      as[kk][ii] = (i < op.m && k < op.k) ? load(op.a, i * op.a_row + k * op.a_col, op.in_type) : 0.0f;
      int jj;
      if (op.b_col == 1) { jj = idx % TILE; kk = idx / TILE; } else { kk = idx % DEPTH; jj = idx / DEPTH; }
      int j = j0 + jj;
      k = k0 + kk;
      bs[kk][jj] = (j < op.n && k < op.k) ? load(op.b, k * op.b_row + j * op.b_col, op.in_type) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < DEPTH; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) { av[r] = as[kk][ty + 16 * r]; bv[r] = bs[kk][tx + 16 * r]; }
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          acc[r][c] = fmaf(av[r], bv[c], acc[r][c]);
          sq[r][c] = fmaf(av[r] * av[r], bv[c] * bv[c], sq[r][c]);
        }
    }
    __syncthreads();
  }
  unsigned long long worst = 0, nans = 0, first_nan = ~0ull, nonfinite = 0;
  double d2 = 0, r2 = 0, b2 = 0;
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      int i = i0 + ty + 16 * r, j = j0 + tx + 16 * c;
      if (i >= op.m || j >= op.n) continue;
      float bias = op.bias_mode == BIAS_ROW ? load(op.bias, i, op.out_type)
                 : op.bias_mode == BIAS_COL ? load(op.bias, j, op.out_type) : 0.0f;
      float product = bd.alpha * acc[r][c];
      float ref = product + bias;
      float bound = bd.safety * (bd.u_out * fabsf(ref) + fabsf(bd.alpha) * bd.sums * sqrtf(sq[r][c])
                                 + bd.u_terms * (fabsf(product) + fabsf(bias))) + bd.tiny;
      float got = load(op.out, i * op.o_row + j * op.o_col, op.out_type);
      unsigned long long index = (unsigned long long)i * op.n + j;
      float diff = got - ref;
      float excess;
      if (isnan(got)) {
        ++nans;
        first_nan = min(first_nan, index);
        excess = INFINITY;
      } else if (isinf(got) || isinf(ref)) {
        ++nonfinite;
        excess = INFINITY;
      } else {
        excess = fabsf(diff) / bound;
        d2 += (double)diff * diff;
        r2 += (double)ref * ref;
      }
      b2 += (double)bound * bound;
      worst = max(worst, ((unsigned long long)__float_as_uint(excess) << 32) | (index & 0xFFFFFFFFull));
    }
  reduce_and_publish(totals, worst, nans, first_nan, nonfinite, d2, r2, b2);
}

// One output's reference, bound and value (for the message about the worst element).
__global__ void point(Operands op, Bound bd, int i, int j, float* result) {
  float acc = 0.0f, sq = 0.0f;
  for (int k = 0; k < op.k; ++k) {
    float a = load(op.a, i * op.a_row + k * op.a_col, op.in_type);
    float b = load(op.b, k * op.b_row + j * op.b_col, op.in_type);
    acc = fmaf(a, b, acc);
    sq = fmaf(a * a, b * b, sq);
  }
  float bias = op.bias_mode == BIAS_ROW ? load(op.bias, i, op.out_type)
             : op.bias_mode == BIAS_COL ? load(op.bias, j, op.out_type) : 0.0f;
  float product = bd.alpha * acc;
  float ref = product + bias;
  result[0] = ref;
  result[1] = bd.safety * (bd.u_out * fabsf(ref) + fabsf(bd.alpha) * bd.sums * sqrtf(sq)
                           + bd.u_terms * (fabsf(product) + fabsf(bias))) + bd.tiny;
  result[2] = load(op.out, i * op.o_row + j * op.o_col, op.out_type);
}

}  // namespace

extern "C" {

// `count` elements drawn from `seed` (see `drawn`: density <= 0 for Normal(0, 1), else -1, 0 and 1).
int l2c_checker_fill(void* p, int64_t count, int dtype, uint64_t seed, float density, void* stream) {
  if (count <= 0) return 0;
  fill<<<grid_for(count), 256, 0, (cudaStream_t)stream>>>(p, count, dtype, seed, density);
  return (int)cudaGetLastError();
}

// How many of the `count` elements at `p` differ from what l2c_checker_fill stored with these arguments, into
// `changed` (8 bytes of host memory); `scratch` is 8 bytes of device memory.
int l2c_checker_changed(const void* p, int64_t count, int dtype, uint64_t seed, float density, void* scratch,
                        void* changed, void* stream) {
  cudaStream_t s = (cudaStream_t)stream;
  return counted(scratch, changed, s, [&] {
    if (count > 0)
      count_changed<<<grid_for(count), 256, 0, s>>>(p, count, dtype, seed, density, (unsigned long long*)scratch);
  });
}

// How many of the `bytes` bytes at `p` are no longer l2c_checker_poison's, into `changed` (as for changed).
int l2c_checker_unpoisoned(const void* p, int64_t bytes, void* scratch, void* changed, void* stream) {
  cudaStream_t s = (cudaStream_t)stream;
  return counted(scratch, changed, s, [&] {
    if (bytes > 0)
      count_unpoisoned<<<grid_for(bytes), 256, 0, s>>>((const unsigned char*)p, bytes, (unsigned long long*)scratch);
  });
}

// NaN in every float type: all bits set.
int l2c_checker_poison(void* p, int64_t bytes, void* stream) {
  return (int)cudaMemsetAsync(p, 0xFF, (size_t)bytes, (cudaStream_t)stream);
}

// Compare `out` with the reference; `scratch` is 64 bytes of device memory, `totals` 56 bytes of host memory
// (Totals), filled when this returns (the stream is synchronized).
int l2c_checker_compare(const void* a, int64_t a_row, int64_t a_col, const void* b, int64_t b_row, int64_t b_col,
                        const void* out, int64_t o_row, int64_t o_col, const void* bias, int bias_mode, int m, int n,
                        int k, int in_type, int out_type, float alpha, float u_out, float sums, float u_terms,
                        float safety, float tiny, void* scratch, void* totals, void* stream) {
  cudaStream_t s = (cudaStream_t)stream;
  Operands op{a, a_row, a_col, b, b_row, b_col, out, o_row, o_col, bias, bias_mode, m, n, k, in_type, out_type};
  Bound bd{alpha, u_out, sums, u_terms, safety, tiny};
  Totals start{0, 0, ~0ull, 0, 0.0, 0.0, 0.0};
  cudaError_t err = cudaMemcpyAsync(scratch, &start, sizeof(Totals), cudaMemcpyHostToDevice, s);
  if (err != cudaSuccess) return (int)err;
  if (m > 0 && n > 0) {
    dim3 grid((n + TILE - 1) / TILE, (m + TILE - 1) / TILE);
    compare<<<grid, THREADS, 0, s>>>(op, bd, (Totals*)scratch);
    if ((err = cudaGetLastError()) != cudaSuccess) return (int)err;
  }
  if ((err = cudaMemcpyAsync(totals, scratch, sizeof(Totals), cudaMemcpyDeviceToHost, s)) != cudaSuccess)
    return (int)err;
  return (int)cudaStreamSynchronize(s);
}

// Output (i, j)'s reference, bound and value into `values` (3 floats of host memory); `scratch` as for compare.
int l2c_checker_point(const void* a, int64_t a_row, int64_t a_col, const void* b, int64_t b_row, int64_t b_col,
                      const void* out, int64_t o_row, int64_t o_col, const void* bias, int bias_mode, int m, int n,
                      int k, int in_type, int out_type, float alpha, float u_out, float sums, float u_terms,
                      float safety, float tiny, int i, int j, void* scratch, void* values, void* stream) {
  cudaStream_t s = (cudaStream_t)stream;
  Operands op{a, a_row, a_col, b, b_row, b_col, out, o_row, o_col, bias, bias_mode, m, n, k, in_type, out_type};
  Bound bd{alpha, u_out, sums, u_terms, safety, tiny};
  point<<<1, 1, 0, s>>>(op, bd, i, j, (float*)scratch);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return (int)err;
  if ((err = cudaMemcpyAsync(values, scratch, 3 * sizeof(float), cudaMemcpyDeviceToHost, s)) != cudaSuccess)
    return (int)err;
  return (int)cudaStreamSynchronize(s);
}

}  // extern "C"
