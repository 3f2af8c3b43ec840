// Checks and times the optimiser kernels (llmc/adamw.cuh) against the CPU backend: the global
// gradient norm (deterministic two-stage sum) and AdamW with clipping and per-segment weight
// decay, frozen parameter kinds left out, including the refreshed bf16 copy of the weights; and the
// candidate AdamW in tiles against it, bit for bit, and both timed at d22. Build: make build/dev_optimizer.
#include <cstring>
#include "dev/cuda/common.h"
#include "llmc/adamw.cuh"
#include "llmc/model_cpu.h"

// adamw_kernel and the candidate adamw_tiles_kernel from the same state (P weights and gradients,
// the AdamW state from weight state_begin on, the bf16 copy filled with NaN): the same bits of the
// weights, both moments and the whole bf16 copy (what no segment holds left as it was), and some
// weight moved; with `timed`, the time of each.
static void compare_adamw_kernels(const std::string& label, size_t P, const std::vector<ParamSegment>& segs,
                                  long long state_begin, bool timed = false) {
    Rng rng{P + segs.size()};
    const size_t S = P - state_begin;
    const std::vector<float> params = random_values(P, 0.02f, rng), grads = random_values(P, 0.01f, rng);
    const std::vector<float> m = random_values(S, 0.001f, rng);
    std::vector<float> v = random_values(S, 0.001f, rng);
    for (float& x : v) x = fabsf(x);  // a second moment is never negative
    const std::vector<int> first = adamw_tile_starts(segs);
    ParamSegment* d_segs = upload(segs);
    int* d_first = upload(first);
    float *d_norm = upload(std::vector<float>{2.0f}), *d_grads = upload(grads);
    float *w[2], *mm[2], *vv[2];
    bf16* wb[2];
    for (int k = 0; k < 2; k++) {
        w[k] = upload(params), mm[k] = upload(m), vv[k] = upload(v);
        cudaCheck(cudaMalloc(&wb[k], P * sizeof(bf16)));
        cudaCheck(cudaMemset(wb[k], 0xFF, P * sizeof(bf16)));
    }
    auto step = [&](int k) {  // clipping active: the norm 2 to 1
        if (k == 0)
            adamw_step(w[0], wb[0], d_grads, mm[0], vv[0], state_begin, d_segs, (int)segs.size(), d_norm, 1.0f, 1e-3f, 0.9f,
                       0.95f, 1e-8f, 0.1f, 3, 0);
        else
            adamw_step_tiles(w[1], wb[1], d_grads, mm[1], vv[1], state_begin, d_segs, d_first, (int)segs.size(), first.back(),
                             d_norm, 1.0f, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0);
    };
    step(0);
    step(1);
    auto same = [](const auto& a, const auto& b) { return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof a[0]) == 0; };
    const std::vector<float> w0 = download(w[0], P);
    report(same(w0, download(w[1], P)) && same(download(mm[0], S), download(mm[1], S)) &&
               same(download(vv[0], S), download(vv[1], S)) && same(download(wb[0], P), download(wb[1], P)) && w0 != params,
           "adamw in tiles: adamw's weights, moments and bf16 copy, bit for bit (" + label + ")");
    if (timed) {
        const float ms = time_ms([&] { step(0); }), tiles_ms = time_ms([&] { step(1); });
        // bytes a weight: the weight, its gradient and two moments read (16), the weight and moments
        // written and the bf16 copy (14)
        printf("   %s, %zu parameters in %zu segments: adamw %.3f ms (%.0f GB/s), in %d tiles %.3f ms (%.0f GB/s, %.2fx)\n",
               label.c_str(), P, segs.size(), ms, 30.0 * P / ms / 1e6, first.back(), tiles_ms, 30.0 * P / tiles_ms / 1e6,
               ms / tiles_ms);
    }
    for (int k = 0; k < 2; k++)
        for (void* q : {(void*)w[k], (void*)mm[k], (void*)vv[k], (void*)wb[k]}) cudaCheck(cudaFree(q));
    for (void* q : {(void*)d_segs, (void*)d_first, (void*)d_norm, (void*)d_grads}) cudaCheck(cudaFree(q));
}

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
    // The candidate in tiles (adamw_tiles): the bits of the kernel above, on the whole model, on the
    // shards, on segments that start or end off a 16-byte run (its one-weight path; the models'
    // segments and shards never do), and at d22, where both are timed.
    compare_adamw_kernels("d6, a frozen set", P, segs, 0);
    for (int rank = 0; rank < 3; rank++) {
        ParamShard sh = param_shard(P, rank, 3);
        compare_adamw_kernels(strprintf("d6, shard %d of 3", rank), P, shard_segments(segs, sh), (long long)sh.begin);
    }
    compare_adamw_kernels("segments off 16-byte runs, state from weight 1", 20000,
                          {{1, 5000, 1}, {5001, 3, 0}, {5004, 0, 1}, {5004, 4099, 1}, {9103, 2047, 0}, {11200, 6001, 1}}, 1);
    compare_adamw_kernels("segments with a partial last run, state from weight 0", 20000,
                          {{1, 5000, 1}, {5004, 4099, 0}, {9104, 6149, 1}, {15256, 4744, 0}}, 0);
    ModelConfig d22;
    apply_preset(d22, *find_preset("d22"));
    d22.vocab_size = 8192;
    compare_adamw_kernels("d22", num_parameters(d22), adamw_segments(d22, 0), 0, true);
    float norm_ms = time_ms([&] { global_norm(); });
    float adam_ms = time_ms([&] {
        adamw_step(d_params, d_bf16, d_grads, d_m, d_v, 0, d_segs, (int)segs.size(), d_norm, clip, opt.lr, opt.beta1, opt.beta2,
                   opt.eps, opt.weight_decay, 3, 0);
    });
    printf("   %zu parameters: norm %.3f ms (%.0f GB/s), adamw %.3f ms (%.0f GB/s)\n", P, norm_ms, 4.0 * P / norm_ms / 1e6,
           adam_ms, 30.0 * P / adam_ms / 1e6);
    return test_exit_code();
}
