// The final weights of a backend's AdamW steps against the reference's (test/reference.py: the
// same steps in float64 from the same float32 weights), per parameter tensor, in norm, with a
// bound propagated from the error its gradients may have through AdamW's 1/sqrt(v) gain.
//
// Error model. AdamW moves a weight by lr_t u_t per step, u_t = m^/(sqrt(v^) + eps), which does not
// depend on the gradient's scale: the first step is sign(g) whatever |g| is. A gradient error dg
// changes u_t by at most about 2 dg / sqrt(v^) (each of the two terms of du/dg, through m^ and
// through v^, is at most 1 / sqrt(v^)), and by at most 2 in all (|u| is about 1 at most with
// these betas: an error can reverse a step, no more). So a backend whose gradient elements are
// within rtol |g| + atol_frac max|g| of the exact ones (what its gradient checks allow) ends
// within e_i = S min(2, 2 (rtol + atol_frac G / sqrt(v^_i))) + T u |w_i| of the exact weights,
// S the sum of the T steps' learning rates, |g_i| taken as its RMS over the steps sqrt(v^_i), G the
// tensor's largest sqrt(v^), and T u |w_i| the float32 rounding of the stored weights. A weight
// whose gradient is rounding noise (v^ tiny) may move by up to 2 S: element by element the
// error has no useful bound, which is why the check is in norm: ||got - want|| <= ||e|| per tensor.
// The reference's own v (its final second moments) gives v^, so the bound does not depend on
// the backend under test. Frozen tensors must keep their initial bits.
#pragma once
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>
#include "../llmc/config.h"
#include "../llmc/math.h"
#include "tensorfile.h"
#include "testing.h"

struct AdamWCheck {
    double grad_rtol, grad_atol_frac;  // the gradient error the bound assumes (see above)
    double beta2;                      // AdamW's, for the bias correction of v
};

// got: the backend's weights after the reference's steps (hyper: steps, warm-up, peak learning
// rate, floor fraction) from `initial`; frozen: the kinds it held fixed.
inline void check_adamw_final_weights(const std::string& label, const ModelConfig& c, uint32_t frozen, const float* initial,
                                      const float* got, const std::map<std::string, NamedTensor>& ref,
                                      const std::string& dbg, const AdamWCheck& k) {
    const std::vector<double>& hyper = tensor_or_fail(ref, "hyper", dbg).values;
    const std::vector<double>& want = tensor_or_fail(ref, "final_params", dbg).values;
    const std::vector<double>& v = tensor_or_fail(ref, "final_adam_v", dbg).values;
    if (want.size() != num_parameters(c) || v.size() != want.size()) fail("%s: final weights of another size", dbg.c_str());
    int steps = (int)hyper[0], warmup = (int)hyper[1];
    float peak = (float)hyper[2], floor = (float)(hyper[2] * hyper[3]);
    double S = 0;
    for (int t = 0; t < steps; t++) S += lr_at_step(t, steps, warmup, peak, floor);
    double bc2 = 1.0 - pow(k.beta2, steps), u = std::ldexp(1.0, -24);
    for (int kind = 0; kind < P_NUM_KINDS; kind++)
        for (int l = 0; l < param_layers(c, kind); l++) {
            size_t off = param_offset(c, kind, l), n = param_numel(c, kind);
            std::string name = label + "adamw final weights " + param_name(kind, l);
            if (frozen & param_kind_bit(kind)) {
                bool kept = memcmp(got + off, initial + off, n * sizeof(float)) == 0, ref_kept = true;
                for (size_t i = 0; i < n; i++) ref_kept &= want[off + i] == (double)initial[off + i];
                report(kept && ref_kept, name + " (frozen): the initial bits",
                       kept ? (ref_kept ? "" : "the reference moved them") : "the backend moved them");
                continue;
            }
            double G = 0;
            for (size_t i = 0; i < n; i++) G = std::fmax(G, sqrt(v[off + i] / bc2));
            double err2 = 0, moved2 = 0, bound2 = 0, max_err = 0;
            for (size_t i = 0; i < n; i++) {
                double d = got[off + i] - want[off + i], moved = want[off + i] - initial[off + i];
                double root_v = sqrt(v[off + i] / bc2);
                double gain = root_v > 0 ? G / root_v : INFINITY;
                double e = S * std::fmin(2.0, 2.0 * (k.grad_rtol + k.grad_atol_frac * gain)) + steps * u * std::fabs(want[off + i]);
                err2 += d * d;
                moved2 += moved * moved;
                bound2 += e * e;
                max_err = std::fmax(max_err, std::fabs(d));
            }
            double moved = sqrt(moved2);
            check_within(name, sqrt(err2), sqrt(bound2),
                         strprintf("||got - want|| is %.3g of the weights' movement ||want - initial|| %.3g (bound: %.3g "
                                   "of it); largest element error %.3g, %.3g of the steps' learning rates",
                                   sqrt(err2) / moved, moved, sqrt(bound2) / moved, max_err, max_err / S));
        }
}
