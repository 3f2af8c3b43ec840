// The fused classifier: softmax, cross-entropy and the gradient of the logits in one kernel, one
// block per row. Logits rows are V wide with a stride of Vp (V rounded up to a multiple of 128 so
// that every row starts aligned); the padding never takes part. With a non-zero dloss the kernel
// overwrites the logits with dlogits = (softmax - onehot(target)) * dloss, so the [N, V]
// probabilities are never stored.
#pragma once
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

inline void classifier(bf16* logits, float* losses, const int* targets, int N, int V, int Vp, float dloss, cudaStream_t s) {
    classifier_kernel<<<N, 512, 0, s>>>(logits, losses, targets, V, Vp, dloss);
    cuda_check_launch();
}
