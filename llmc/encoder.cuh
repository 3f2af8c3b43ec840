// Token embedding: forward gathers rows of wte, backward adds each position's gradient to its
// token's row. The backward pass is deterministic without atomics: the host groups the positions
// of a batch by token (it has the tokens anyway), and one block per distinct token adds that
// token's positions in position order.
#pragma once
#include <vector>
#include "cuda_common.cuh"

__global__ void embedding_forward_kernel(bf16* out, const int* tokens, const bf16* wte, int N, int C) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)N * C) return;
    long long n = idx / C, i = idx % C;
    out[idx] = wte[(size_t)tokens[n] * C + i];
}

inline void embedding_forward(bf16* out, const int* tokens, const bf16* wte, int N, int C, cudaStream_t s) {
    embedding_forward_kernel<<<ceil_div((long long)N * C, 256), 256, 0, s>>>(out, tokens, wte, N, C);
    cuda_check_launch();
}

// The batch's positions grouped by token: token[k] owns positions[offset[k] .. offset[k+1]).
struct TokenBuckets {
    std::vector<int> token, offset, positions;
};

inline void group_positions_by_token(TokenBuckets& b, const int* tokens, int N, int V) {
    std::vector<int> count(V, 0);
    for (int n = 0; n < N; n++) count[tokens[n]]++;
    b.token.clear();
    b.offset.assign(1, 0);
    std::vector<int> start(V, -1);
    for (int v = 0; v < V; v++)
        if (count[v]) {
            start[v] = b.offset.back();
            b.token.push_back(v);
            b.offset.push_back(b.offset.back() + count[v]);
        }
    b.positions.resize(N);
    for (int n = 0; n < N; n++) b.positions[start[tokens[n]]++] = n;  // positions stay in order
}

__global__ void embedding_backward_kernel(float* dwte, const bf16* dout, const int* bucket_token,
                                          const int* bucket_offset, const int* positions, int C) {
    int k = blockIdx.x;
    float* row = dwte + (size_t)bucket_token[k] * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float acc = 0.0f;
        for (int p = bucket_offset[k]; p < bucket_offset[k + 1]; p++) acc += __bfloat162float(dout[(size_t)positions[p] * C + i]);
        row[i] += acc;
    }
}

// The candidate embedding_ahead: the same sums in the same order, a thread's next kEmbeddingAhead
// rows loaded before the first of them is added. The kernel above waits on two loads' latency (the
// position, then its values) at every row or every few, as the compiler unrolls its loop; its
// longest block, the batch's most frequent token (hundreds of positions), bounds it. Here that wait
// comes once every kEmbeddingAhead rows. A thread takes two neighbouring columns, one 4-byte load a
// row (C even).
constexpr int kEmbeddingAhead = 16;
__global__ void embedding_backward_ahead_kernel(float* dwte, const bf16* dout, const int* bucket_token,
                                                const int* bucket_offset, const int* positions, int C) {
    const int k = blockIdx.x, begin = bucket_offset[k], end = bucket_offset[k + 1];
    float* row = dwte + (size_t)bucket_token[k] * C;
    for (int i = 2 * threadIdx.x; i < C; i += 2 * blockDim.x) {
        float acc0 = 0.0f, acc1 = 0.0f;
        for (int p0 = begin; p0 < end; p0 += kEmbeddingAhead) {
            __nv_bfloat162 v[kEmbeddingAhead];
#pragma unroll
            for (int a = 0; a < kEmbeddingAhead; a++) {  // past the bucket's end: its last row again, unused
                const int p = min(p0 + a, end - 1);
                v[a] = *reinterpret_cast<const __nv_bfloat162*>(dout + (size_t)positions[p] * C + i);
            }
#pragma unroll
            for (int a = 0; a < kEmbeddingAhead; a++)
                if (p0 + a < end) {
                    acc0 += __low2float(v[a]);
                    acc1 += __high2float(v[a]);
                }
        }
        row[i] += acc0;
        row[i + 1] += acc1;
    }
}

// device_buckets: 3N + 1 ints of device memory for the three arrays. ahead: the kernel above, where
// C is even (the same bits).
inline void embedding_backward(float* dwte, const bf16* dout, const TokenBuckets& b, int* device_buckets, int N, int C,
                               cudaStream_t s, bool ahead = false) {
    int K = (int)b.token.size();
    int* d_token = device_buckets;
    int* d_offset = d_token + K;
    int* d_positions = d_offset + K + 1;
    cudaCheck(cudaMemcpyAsync(d_token, b.token.data(), K * sizeof(int), cudaMemcpyHostToDevice, s));
    cudaCheck(cudaMemcpyAsync(d_offset, b.offset.data(), (K + 1) * sizeof(int), cudaMemcpyHostToDevice, s));
    cudaCheck(cudaMemcpyAsync(d_positions, b.positions.data(), N * sizeof(int), cudaMemcpyHostToDevice, s));
    if (ahead && C % 2 == 0)
        embedding_backward_ahead_kernel<<<K, 256, 0, s>>>(dwte, dout, d_token, d_offset, d_positions, C);
    else
        embedding_backward_kernel<<<K, 256, 0, s>>>(dwte, dout, d_token, d_offset, d_positions, C);
    cuda_check_launch();
}
