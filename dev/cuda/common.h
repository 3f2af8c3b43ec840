// Shared by the kernel checks in dev/cuda: random inputs that are exactly representable in bf16
// (so the CPU reference and the GPU see the same numbers), device copies, and a timer.
#pragma once
#include <cstring>
#include <functional>
#include <vector>
#include "llmc/cuda_common.cuh"
#include "llmc/rand.h"
#include "test/testing.h"

// Whether two results are the same bits (NaN equal to itself, -0 apart from +0, as == does not).
template <typename T>
inline bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Random values of either sign and never zero (|x| >= 0.05 * gain), rounded to bf16.
inline std::vector<float> random_values(size_t n, float gain, Rng& rng) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) {
        float x = rng_normal(rng);
        if (fabsf(x) < 0.05f) x = x < 0 ? -0.05f : 0.05f;
        v[i] = __bfloat162float(__float2bfloat16(x * gain));
    }
    return v;
}

inline bf16* upload_bf16(const std::vector<float>& v) {
    std::vector<bf16> b(v.size());
    for (size_t i = 0; i < v.size(); i++) b[i] = __float2bfloat16(v[i]);
    bf16* d;
    cudaCheck(cudaMalloc(&d, b.size() * sizeof(bf16)));
    cudaCheck(cudaMemcpy(d, b.data(), b.size() * sizeof(bf16), cudaMemcpyHostToDevice));
    return d;
}

template <typename T>
inline T* upload(const std::vector<T>& v) {
    T* d;
    cudaCheck(cudaMalloc(&d, v.size() * sizeof(T)));
    cudaCheck(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

inline std::vector<float> download_bf16(const bf16* d, size_t n) {
    std::vector<bf16> b(n);
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemcpy(b.data(), d, n * sizeof(bf16), cudaMemcpyDeviceToHost));
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = __bfloat162float(b[i]);
    return v;
}

template <typename T>
inline std::vector<T> download(const T* d, size_t n) {
    std::vector<T> v(n);
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

// Results against the CPU backend's float32 answer from the same bf16-exact inputs:
// |a - b| <= atol + 0.079 |b|, atol a fraction (1% by default) of the reference's largest magnitude.
// Error model: a kernel rounds its output to bf16 (8 significant bits, u = 2^-8: 0.39% at most)
// and adds in float32 in another order than the CPU (a few u32 = 6e-8 of its terms' magnitudes),
// so about 0.4% in all; float32 outputs (dW, dgain, rstd) only the latter. The bound is the
// model-level bf16 tolerance of test/test_gpt_cuda.cu (sqrt(320) u for a chain of products),
// shared so that every kernel fits within the model's budget: twenty times one rounding, it
// catches a wrong index, term or scale, not a last bit. atol covers the elements that are small
// by cancellation (a product's outputs, dinp, dx), which keep the absolute error of their terms.
inline bool compare_to_reference(const std::string& name, const std::vector<float>& got, const std::vector<float>& want,
                                 double atol_frac = 0.01) {
    double maxabs = 0;
    for (float w : want) maxabs = std::fmax(maxabs, std::fabs(w));
    if (got.size() != want.size()) {
        report(false, name, "sizes differ");
        return false;
    }
    return check_close(name, got.data(), want.data(), want.size(), 0.079, atol_frac * maxabs);
}

// Mean milliseconds of fn over `reps` runs after two warm-up runs.
inline float time_ms(const std::function<void()>& fn, int reps = 20) {
    fn();
    fn();
    cudaEvent_t a, b;
    cudaCheck(cudaEventCreate(&a));
    cudaCheck(cudaEventCreate(&b));
    cudaCheck(cudaEventRecord(a));
    for (int i = 0; i < reps; i++) fn();
    cudaCheck(cudaEventRecord(b));
    cudaCheck(cudaEventSynchronize(b));
    float ms;
    cudaCheck(cudaEventElapsedTime(&ms, a, b));
    return ms / reps;
}

inline bool require_gpu() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        printf("no CUDA device: nothing to check\n");
        return false;
    }
    cudaDeviceProp p;
    cudaCheck(cudaGetDeviceProperties(&p, 0));
    printf("device: %s\n", p.name);
    return true;
}
