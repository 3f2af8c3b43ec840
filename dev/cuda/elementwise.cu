// Checks and times the token-wise kernels against the CPU backend: the fused classifier
// (llmc/classifier.cuh), SwiGLU (llmc/swiglu.cuh) and the embedding (llmc/encoder.cuh), whose
// backward pass must also give the same bits twice. Build: make build/dev_elementwise.
#include "dev/cuda/common.h"
#include "llmc/classifier.cuh"
#include "llmc/encoder.cuh"
#include "llmc/model_cpu.h"
#include "llmc/swiglu.cuh"

// The classifier, the default kernel (vec false) or the candidate, against the CPU backend's
// cross-entropy: the losses of a forward pass, the logits left alone by it, and the gradient in place
// of the logits; then the time of a forward and a backward pass (a fresh copy of the logits each).
static float check_classifier(int N, int V, bool vec) {
    int Vp = (V + 127) / 128 * 128;
    Rng rng{(uint64_t)N + V};
    std::vector<float> logits = random_values((size_t)N * V, 3.0f, rng), padded((size_t)N * Vp, 0.0f);
    for (int n = 0; n < N; n++) {
        std::copy(&logits[(size_t)n * V], &logits[(size_t)(n + 1) * V], &padded[(size_t)n * Vp]);
        for (int i = V; i < Vp; i++) padded[(size_t)n * Vp + i] = 1024.0f;  // padding: in no sum (e^1024 would show), never changed
    }
    std::vector<int> targets(N);
    for (int& t : targets) t = (int)(rng_next(rng) % V);
    std::vector<float> losses(N), lse(N), dlogits = logits;
    float dloss = 1.0f / N;
    crossentropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V);
    crossentropy_backward_inplace(dlogits.data(), lse.data(), targets.data(), N, V, dloss);
    bf16* d_logits = upload_bf16(padded);
    int* d_targets = upload(targets);
    float *d_losses, *d_lse;
    cudaCheck(cudaMalloc(&d_losses, N * sizeof(float)));
    cudaCheck(cudaMalloc(&d_lse, N * sizeof(float)));
    const std::string tag = std::string(vec ? " (candidate)" : "") + " N" + std::to_string(N) + " V" + std::to_string(V);
    classifier(d_logits, d_losses, d_lse, d_targets, N, V, Vp, 0.0f, 0, vec);
    // The same bf16-exact logits on both sides: float32 sums of V terms in other orders, and __expf's
    // few 1e-6 in the candidate, so the losses (and the candidate's lse) agree to 1e-5 of their size,
    // which a lost column or chunk of the row would not.
    std::vector<float> got_losses = download(d_losses, N);
    check_close("classifier losses" + tag, got_losses.data(), losses.data(), N, 1e-5, 1e-5);
    if (vec) {
        std::vector<float> got_lse = download(d_lse, N);
        check_close("classifier log-sum-exp" + tag, got_lse.data(), lse.data(), N, 1e-5, 1e-5);
    }
    // With dloss 0 the logits are only read: the same bits.
    std::vector<float> kept = download_bf16(d_logits, padded.size());
    check_close("classifier leaves logits alone when dloss = 0" + tag, kept.data(), padded.data(), padded.size(), 0.0, 0.0);
    classifier(d_logits, d_losses, d_lse, d_targets, N, V, Vp, dloss, 0, vec);
    std::vector<float> got = download_bf16(d_logits, padded.size()), got_unpadded((size_t)N * V);
    bool padding_kept = true;
    for (int n = 0; n < N; n++) {
        std::copy(&got[(size_t)n * Vp], &got[(size_t)n * Vp + V], &got_unpadded[(size_t)n * V]);
        for (int i = V; i < Vp; i++) padding_kept = padding_kept && got[(size_t)n * Vp + i] == 1024.0f;
    }
    compare_to_reference("classifier dlogits" + tag, got_unpadded, dlogits);
    report(padding_kept, "classifier leaves the padding alone" + tag);
    bf16* d_fresh = upload_bf16(padded);
    float ms = time_ms([&] {
        cudaCheck(cudaMemcpy(d_logits, d_fresh, padded.size() * sizeof(bf16), cudaMemcpyDeviceToDevice));
        classifier(d_logits, d_losses, d_lse, d_targets, N, V, Vp, 0.0f, 0, vec);
        classifier(d_logits, d_losses, d_lse, d_targets, N, V, Vp, dloss, 0, vec);
    });
    printf("   classifier%s: forward and backward %.3f ms including a %.0f MB copy\n", tag.c_str(), ms,
           padded.size() * 2 / 1e6);
    for (void* p : {(void*)d_logits, (void*)d_targets, (void*)d_losses, (void*)d_lse, (void*)d_fresh}) cudaCheck(cudaFree(p));
    return ms;
}

static void check_classifiers(int N, int V) {
    float ms_default = check_classifier(N, V, false), ms_vec = check_classifier(N, V, true);
    printf("   classifier N%d V%d: candidate %.2fx the default's speed\n", N, V, ms_default / ms_vec);
}

static void check_swiglu(int N, int F) {
    Rng rng{(uint64_t)N * 3 + F};
    std::vector<float> fc13 = random_values((size_t)N * 2 * F, 2.0f, rng), dswi = random_values((size_t)N * F, 0.5f, rng);
    std::vector<float> swi((size_t)N * F), dfc13((size_t)N * 2 * F);
    swiglu_forward_rows(swi.data(), fc13.data(), N, F);
    swiglu_backward_rows(dfc13.data(), dswi.data(), fc13.data(), N, F);
    bf16 *d_fc13 = upload_bf16(fc13), *d_dswi = upload_bf16(dswi), *d_swi, *d_dfc13;
    cudaCheck(cudaMalloc(&d_swi, swi.size() * sizeof(bf16)));
    cudaCheck(cudaMalloc(&d_dfc13, dfc13.size() * sizeof(bf16)));
    swiglu_forward_simple(d_swi, d_fc13, N, F, 0);
    swiglu_backward_simple(d_dfc13, d_dswi, d_fc13, N, F, 0);
    compare_to_reference("swiglu forward", download_bf16(d_swi, swi.size()), swi);
    compare_to_reference("swiglu backward", download_bf16(d_dfc13, dfc13.size()), dfc13);
    float fwd = time_ms([&] { swiglu_forward_simple(d_swi, d_fc13, N, F, 0); });
    float bwd = time_ms([&] { swiglu_backward_simple(d_dfc13, d_dswi, d_fc13, N, F, 0); });
    printf("   swiglu N%d F%d: forward %.3f ms (%.0f GB/s), backward %.3f ms (%.0f GB/s)\n", N, F, fwd,
           6.0 * N * F / fwd / 1e6, bwd, 10.0 * N * F / bwd / 1e6);
    if (swiglu_vec_supports(F, {d_swi, d_fc13, d_dfc13, d_dswi})) {
        // The vectorised kernels: the same formula per element, so the same bits as the kernels above.
        std::vector<float> swi_simple = download_bf16(d_swi, swi.size()), dfc13_simple = download_bf16(d_dfc13, dfc13.size());
        cudaCheck(cudaMemset(d_swi, 0, swi.size() * sizeof(bf16)));
        cudaCheck(cudaMemset(d_dfc13, 0, dfc13.size() * sizeof(bf16)));
        swiglu_forward_vec(d_swi, d_fc13, N, F, 0);
        swiglu_backward_vec(d_dfc13, d_dswi, d_fc13, N, F, 0);
        std::vector<float> swi_vec = download_bf16(d_swi, swi.size()), dfc13_vec = download_bf16(d_dfc13, dfc13.size());
        check_close("swiglu forward, vec: the simple kernels' bits", swi_vec.data(), swi_simple.data(), swi.size(), 0.0, 0.0);
        check_close("swiglu backward, vec: the simple kernels' bits", dfc13_vec.data(), dfc13_simple.data(), dfc13.size(), 0.0, 0.0);
        float fwd_vec = time_ms([&] { swiglu_forward_vec(d_swi, d_fc13, N, F, 0); });
        float bwd_vec = time_ms([&] { swiglu_backward_vec(d_dfc13, d_dswi, d_fc13, N, F, 0); });
        printf("   swiglu vec N%d F%d: forward %.3f ms (%.0f GB/s, %.2fx), backward %.3f ms (%.0f GB/s, %.2fx)\n", N, F,
               fwd_vec, 6.0 * N * F / fwd_vec / 1e6, fwd / fwd_vec, bwd_vec, 10.0 * N * F / bwd_vec / 1e6, bwd / bwd_vec);
    }
    for (void* p : {(void*)d_fc13, (void*)d_dswi, (void*)d_swi, (void*)d_dfc13}) cudaCheck(cudaFree(p));
}

static void check_embedding(int N, int C, int V) {
    Rng rng{(uint64_t)N * 5 + C};
    std::vector<float> wte = random_values((size_t)V * C, 1.0f, rng), dout = random_values((size_t)N * C, 0.1f, rng);
    // Gradients 2^-12 .. 2^12 times those: bf16 values of one size (multiples of 2^-15 below 2^9) add
    // up exactly in float32, in any order, and a check of the order of the additions would see none
    for (float& x : dout) x = ldexpf(x, (int)(rng_next(rng) % 25) - 12);
    std::vector<int> tokens(N);
    // repeats, skewed as in text: token 0 about (4 / V)^(1/3) of the positions (8% at V = 8192), the
    // long bucket that bounds the backward kernel
    const int used = std::max(1, V / 4);
    for (int& t : tokens) {
        const double u = (double)(rng_next(rng) % (1u << 30)) / (1u << 30);
        t = std::min(used - 1, (int)(used * u * u * u));
    }
    std::vector<float> emb((size_t)N * C), dwte((size_t)V * C, 0.0f);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++) {
            emb[(size_t)n * C + i] = wte[(size_t)tokens[n] * C + i];
            dwte[(size_t)tokens[n] * C + i] += dout[(size_t)n * C + i];
        }
    bf16 *d_wte = upload_bf16(wte), *d_dout = upload_bf16(dout), *d_emb;
    int *d_tokens = upload(tokens), *d_buckets;
    float* d_dwte = upload(std::vector<float>((size_t)V * C, 0.0f));
    cudaCheck(cudaMalloc(&d_emb, emb.size() * sizeof(bf16)));
    cudaCheck(cudaMalloc(&d_buckets, (3 * (size_t)N + 1) * sizeof(int)));
    embedding_forward(d_emb, d_tokens, d_wte, N, C, 0);
    // A copy of bf16 rows: the same bits.
    std::vector<float> got_emb = download_bf16(d_emb, emb.size());
    check_close("embedding forward", got_emb.data(), emb.data(), emb.size(), 0.0, 0.0);
    TokenBuckets b;
    group_positions_by_token(b, tokens.data(), N, V);
    embedding_backward(d_dwte, d_dout, b, d_buckets, N, C, 0);
    std::vector<float> first = download(d_dwte, dwte.size());
    compare_to_reference("embedding backward", first, dwte);
    cudaCheck(cudaMemset(d_dwte, 0, dwte.size() * sizeof(float)));
    embedding_backward(d_dwte, d_dout, b, d_buckets, N, C, 0);
    report(same_bits(download(d_dwte, dwte.size()), first), "embedding backward gives the same bits twice");
    float ms = time_ms([&] { embedding_backward(d_dwte, d_dout, b, d_buckets, N, C, 0); });
    printf("   embedding backward N%d C%d: %.3f ms (with the bucket upload)\n", N, C, ms);
    // The candidate embedding_ahead: ./train's kernel's bits from zeros, and added into the same
    // nonzero gradients (the kernels add into dwte), where C is even
    if (C % 2 == 0) {
        const std::string name = "embedding backward N" + std::to_string(N) + " C" + std::to_string(C) + ", loading ahead";
        cudaCheck(cudaMemset(d_dwte, 0, dwte.size() * sizeof(float)));
        embedding_backward(d_dwte, d_dout, b, d_buckets, N, C, 0, true);
        report(same_bits(download(d_dwte, dwte.size()), first), name + ": ./train's bits");
        cudaCheck(cudaMemcpy(d_dwte, first.data(), first.size() * sizeof(float), cudaMemcpyHostToDevice));
        embedding_backward(d_dwte, d_dout, b, d_buckets, N, C, 0);
        const std::vector<float> twice = download(d_dwte, dwte.size());
        cudaCheck(cudaMemcpy(d_dwte, first.data(), first.size() * sizeof(float), cudaMemcpyHostToDevice));
        embedding_backward(d_dwte, d_dout, b, d_buckets, N, C, 0, true);
        report(same_bits(download(d_dwte, dwte.size()), twice), name + ", added into nonzero gradients: ./train's bits");
        float ahead = time_ms([&] { embedding_backward(d_dwte, d_dout, b, d_buckets, N, C, 0, true); });
        printf("   embedding backward N%d C%d, loading ahead: %.3f ms (%.2fx)\n", N, C, ahead, ms / ahead);
    }
    for (void* p : {(void*)d_wte, (void*)d_dout, (void*)d_emb, (void*)d_tokens, (void*)d_buckets, (void*)d_dwte}) cudaCheck(cudaFree(p));
}

int main() {
    if (!require_gpu()) return 0;
    check_classifiers(5, 300);
    check_classifiers(7, 3004);  // the candidate's last partial chunk in a thread's second load
    check_classifiers(4096, 8192);
    check_swiglu(3, 40);
    check_swiglu(3, 44);  // F % 8 != 0: the simple kernels alone
    check_swiglu(8 * 2048, 1536);
    check_embedding(5, 6, 7);  // buckets shorter than a load ahead, C below a block's columns
    check_embedding(8 * 2048, 512, 8192);
    check_embedding(4 * 2048, 1024, 8192);  // two passes of a block's columns
    return test_exit_code();
}
