// Checks and times the optimiser kernels (llmc/adamw.cuh) against the CPU backend: the global
// gradient norm (deterministic two-stage sum) and AdamW with clipping and per-segment weight
// decay, frozen parameter kinds left out, including the refreshed bf16 copy of the weights. Build: make build/dev_optimizer.
#include "dev/cuda/common.h"
#include "llmc/adamw.cuh"
#include "llmc/model_cpu.h"

int main() {
    if (!require_gpu()) return 0;
    ModelConfig c;  // the d6 preset's shape
    c.vocab_size = 8192;
    size_t P = num_parameters(c);
    Rng rng{17};
    std::vector<float> params = random_values(P, 0.02f, rng), grads = random_values(P, 0.01f, rng);
    std::vector<float> m = random_values(P, 0.001f, rng), v(P);
    for (float& x : v) x = 1e-6f * rng_uniform(rng);
    CpuModel cpu;
    model_init(cpu, c, 0, 0);
    cpu.params = params;
    cpu.grads = grads;
    cpu.adam_m = m;
    cpu.adam_v = v;
    uint32_t frozen = param_kind_bit(P_WK) | param_kind_bit(P_K_GAIN);  // a matrix and a gain held fixed
    model_freeze(cpu, frozen);
    float norm = model_grad_norm(cpu);
    AdamWSettings opt;
    opt.lr = 1e-3f;
    float clip = 0.5f * norm;  // clipping is active
    model_adamw_step(cpu, opt, 3, norm, clip);

    float *d_params = upload(params), *d_grads = upload(grads), *d_m = upload(m), *d_v = upload(v), *d_norm;
    double *d_partial, *d_sq;
    bf16* d_bf16;
    cudaCheck(cudaMalloc(&d_norm, sizeof(float)));
    cudaCheck(cudaMalloc(&d_partial, kNormBlocks * sizeof(double)));
    cudaCheck(cudaMalloc(&d_sq, sizeof(double)));
    auto global_norm = [&] {  // as the model takes it: the square (summed over processes), then the root
        squared_norm(d_sq, d_partial, d_grads, (long long)P, 0);
        norm_from_square_kernel<<<1, 1>>>(d_norm, d_sq);
        cuda_check_launch();
    };
    cudaCheck(cudaMalloc(&d_bf16, P * sizeof(bf16)));
    float_to_bf16(d_bf16, d_params, (long long)P, 0);  // as the model starts: AdamW refreshes only what it updates
    std::vector<ParamSegment> segs = adamw_segments(c, frozen);
    ParamSegment* d_segs = upload(segs);
    global_norm();
    float gpu_norm = download(d_norm, 1)[0];
    // A sum of positive squares: each thread's float32 partial sum of about 13 terms (6.8M over
    // 1024 x 512 threads), then a block's 512, err by at most their count times u32 (6e-8), 3e-5 at
    // worst and ~1e-6 as they fall at random; 1e-5 relative.
    check_close("global gradient norm", &gpu_norm, &norm, 1, 1e-5, 0);
    global_norm();
    report(download(d_norm, 1)[0] == gpu_norm, "global gradient norm gives the same bits twice");
    adamw_step(d_params, d_bf16, d_grads, d_m, d_v, 0, d_segs, (int)segs.size(), d_norm, clip, opt.lr, opt.beta1, opt.beta2,
               opt.eps, opt.weight_decay, 3, 0);
    std::vector<float> got = download(d_params, P);
    // Both sides run math.h's adamw_update in float32; they differ by the clipping factor, which
    // comes from norms within 1e-5 of each other, and by a few u32 of rounding (fused multiply-adds
    // on the GPU). A step moves a weight by lr |u| <~ lr, so the weights may differ by lr 1e-5 = 1e-8
    // absolute, besides a few u32 relative; a wrong bias correction moves them by ~lr.
    check_close("adamw parameters", got.data(), cpu.params.data(), P, 1e-5, 1e-8);
    // The moments take the clipping factor's 1e-5 relative difference too. m = beta1 m + (1 - beta1)
    // g cancels where the two terms nearly meet, so its tolerance has an absolute part, 1e-6 of the
    // largest moment (several u32 of the terms that cancelled).
    auto max_abs = [](const std::vector<float>& x) {
        float mx = 0.0f;
        for (float v : x) mx = fmaxf(mx, fabsf(v));
        return (double)mx;
    };
    check_close("adamw first moments", download(d_m, P).data(), cpu.adam_m.data(), P, 1e-5, 1e-6 * max_abs(cpu.adam_m));
    check_close("adamw second moments", download(d_v, P).data(), cpu.adam_v.data(), P, 1e-5, 1e-6 * max_abs(cpu.adam_v));
    std::vector<float> rounded(P);
    for (size_t i = 0; i < P; i++) rounded[i] = __bfloat162float(__float2bfloat16(got[i]));
    report(download_bf16(d_bf16, P) == rounded, "adamw refreshes the bf16 weights");
    // ZeRO-1: three processes' shards, each with its own slice of the AdamW state, give the same
    // bits as one process updating everything.
    float* d_sharded = upload(params);
    std::vector<float> m_after = download(d_m, P);
    bool same_state = true;
    for (int rank = 0; rank < 3; rank++) {
        ParamShard sh = param_shard(P, rank, 3);
        std::vector<ParamSegment> cut = shard_segments(segs, sh);
        std::vector<float> m_part(m.begin() + sh.begin, m.begin() + sh.end), v_part(v.begin() + sh.begin, v.begin() + sh.end);
        float *d_mp = upload(m_part), *d_vp = upload(v_part);
        ParamSegment* d_cut = upload(cut);
        adamw_step(d_sharded, d_bf16, d_grads, d_mp, d_vp, (long long)sh.begin, d_cut, (int)cut.size(), d_norm, clip, opt.lr,
                   opt.beta1, opt.beta2, opt.eps, opt.weight_decay, 3, 0);
        same_state &= download(d_mp, m_part.size()) == std::vector<float>(m_after.begin() + sh.begin, m_after.begin() + sh.end);
        for (void* q : {(void*)d_mp, (void*)d_vp, (void*)d_cut}) cudaCheck(cudaFree(q));
    }
    report(download(d_sharded, P) == got && same_state, "adamw on 3 shards (ZeRO-1) gives the bits of one process");
    float norm_ms = time_ms([&] { global_norm(); });
    float adam_ms = time_ms([&] {
        adamw_step(d_params, d_bf16, d_grads, d_m, d_v, 0, d_segs, (int)segs.size(), d_norm, clip, opt.lr, opt.beta1, opt.beta2,
                   opt.eps, opt.weight_decay, 3, 0);
    });
    printf("   %zu parameters: norm %.3f ms (%.0f GB/s), adamw %.3f ms (%.0f GB/s)\n", P, norm_ms, 4.0 * P / norm_ms / 1e6,
           adam_ms, 18.0 * P / adam_ms / 1e6);
    return test_exit_code();
}
