// The fused classifier: softmax, cross-entropy and the gradient of the logits in one kernel, one
// block per row. Logits rows are V wide with a stride of Vp (V rounded up to a multiple of 128 so
// that every row starts aligned); the padding never takes part. With a non-zero dloss the kernel
// overwrites the logits with dlogits = (softmax - onehot(target)) * dloss, so the [N, V]
// probabilities are never stored.
#pragma once
#include <algorithm>
#include "cuda_common.cuh"

__global__ void classifier_kernel(bf16* logits, float* losses, const int* targets, int V, int Vp, float dloss) {
    __shared__ float shared[32];
    int row = blockIdx.x;
    bf16* z = logits + (size_t)row * Vp;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, __bfloat162float(z[i]));
    m = block_max(m, shared);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) sum += expf(__bfloat162float(z[i]) - m);
    sum = block_sum(sum, shared);
    float lse = m + logf(sum);
    int target = targets[row];
    if (threadIdx.x == 0) losses[row] = lse - __bfloat162float(z[target]);
    if (dloss == 0.0f) return;
    __syncthreads();  // thread 0 has read z[target] before anyone overwrites it
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float p = expf(__bfloat162float(z[i]) - lse);
        z[i] = __float2bfloat16((p - (i == target ? 1.0f : 0.0f)) * dloss);
    }
}

// ./train's (dev_elementwise checks it against the kernel above and times both): the kernel above
// reads a row 2 bytes a thread, in two passes for the loss and three more for the gradient, each
// term through expf. Here the forward pass reads the row once, 16 bytes a thread, keeping a running
// maximum and a sum rescaled when it rises (the thread's sums then meet at the row's maximum), and
// keeps the row's log-sum-exp (lse [N]); the backward pass is then one elementwise pass, dlogits =
// (e^(z - lse) - onehot(target)) dloss, its terms through __expf (one ex2.approx: a few 1e-6
// relative for the terms above 1e-9, under bf16's 4e-3). Padding (columns V .. Vp - 1) is never
// read into a sum and never changed. Rows start 16-byte aligned (Vp is a multiple of 128).
inline bool classifier_vec_supports(const bf16* logits, int Vp) { return Vp % 8 == 0 && aligned_16({logits}); }

// The 8 logits of the 16 bytes at z + i as floats, those at V or beyond (padding) as -inf: in no
// maximum, and e^(-inf) = 0 in no sum.
__device__ __forceinline__ void logits_chunk(float (&x)[8], uint4 v, int i, int V) {
    bf16x8_to_float(v, x);
    for (int k = 0; k < 8; k++) x[k] = i + k < V ? x[k] : -INFINITY;
}

// Each thread loads 4 chunks of its row before it uses the first, so that 4 loads are in flight.
__global__ void __launch_bounds__(256) classifier_forward_vec_kernel(const bf16* __restrict__ logits, float* losses,
                                                                     float* lse, const int* targets, int V, int Vp) {
    constexpr int kInFlight = 4;
    __shared__ float shared[32];
    const int row = blockIdx.x, stride = 8 * blockDim.x;
    const bf16* z = logits + (size_t)row * Vp;
    float m = -INFINITY, sum = 0.0f;
    for (int base = 8 * threadIdx.x; base < V; base += kInFlight * stride) {
        uint4 v[kInFlight];
#pragma unroll
        for (int u = 0; u < kInFlight; u++) {
            const int i = base + u * stride;
            v[u] = i < V ? *reinterpret_cast<const uint4*>(z + i) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kInFlight; u++) {
            const int i = base + u * stride;
            if (i >= V) break;
            float x[8];
            logits_chunk(x, v[u], i, V);
            float chunk_max = x[0];
            for (int k = 1; k < 8; k++) chunk_max = fmaxf(chunk_max, x[k]);
            const float m_new = fmaxf(m, chunk_max);
            const float shift = m_new == -INFINITY ? 0.0f : m_new;  // no -inf - -inf while all are -inf
            sum *= __expf(m - shift);                                // 0 * e^(-inf) = 0 at the first chunk
            for (int k = 0; k < 8; k++) sum += __expf(x[k] - shift);
            m = m_new;
        }
    }
    const float row_max = block_max(m, shared);
    const float row_sum = block_sum(m == -INFINITY ? 0.0f : sum * __expf(m - row_max), shared);
    if (threadIdx.x == 0) {
        const float l = row_max + logf(row_sum);
        lse[row] = l;
        losses[row] = l - __bfloat162float(z[targets[row]]);
    }
}

__global__ void __launch_bounds__(256) classifier_backward_vec_kernel(bf16* logits, const float* lse, const int* targets,
                                                                      long long chunks, int V, int Vp, float dloss) {
    const int row_chunks = Vp / 8;
    for (long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += (long long)gridDim.x * blockDim.x) {
        const long long row = c / row_chunks;
        const int i = (int)(c % row_chunks) * 8;
        if (i >= V) continue;  // all padding
        uint4* at = reinterpret_cast<uint4*>(logits + row * Vp + i);
        const uint4 v = *at;
        const float l = lse[row];
        const int target = targets[row];
        float x[8], d[8];
        bf16x8_to_float(v, x);
        for (int k = 0; k < 8; k++) {
            const float grad = (__expf(x[k] - l) - (i + k == target ? 1.0f : 0.0f)) * dloss;
            d[k] = i + k < V ? grad : x[k];  // padding kept as it was
        }
        *at = float_to_bf16x8(d);
    }
}

// The losses of N rows of logits, and with a non-zero dloss their gradient in place of the logits.
// lse [N]: the rows' log-sum-exp, which the vectorised forward writes and its backward reads (the
// kernel above neither). `vec` takes the vectorised kernels; their backward (dloss != 0) needs the
// lse of a forward (dloss = 0) of the same logits, and leaves the losses as that forward wrote
// them.
inline void classifier(bf16* logits, float* losses, float* lse, const int* targets, int N, int V, int Vp, float dloss,
                       cudaStream_t s, bool vec = true) {
    if (!vec || !classifier_vec_supports(logits, Vp)) {
        classifier_kernel<<<N, 512, 0, s>>>(logits, losses, targets, V, Vp, dloss);
    } else if (dloss == 0.0f) {
        classifier_forward_vec_kernel<<<N, 256, 0, s>>>(logits, losses, lse, targets, V, Vp);
    } else {
        const long long chunks = (long long)N * (Vp / 8);
        classifier_backward_vec_kernel<<<(int)std::min<long long>(ceil_div(chunks, 256), 65535LL * 16), 256, 0, s>>>(
            logits, lse, targets, chunks, V, Vp, dloss);
    }
    cuda_check_launch();
}
