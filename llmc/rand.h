// A small, platform-independent random number generator: the same seed gives the same model
// on every machine and compiler (the standard library's distributions differ between vendors).
#pragma once
#include <cmath>
#include <cstdint>

struct Rng {
    uint64_t state;
};

// splitmix64: a 64-bit state advanced by a constant and scrambled; passes BigCrush.
inline uint64_t rng_next(Rng& r) {
    uint64_t z = (r.state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Uniform in [0, 1) with 24 random bits, exactly representable as a float.
inline float rng_uniform(Rng& r) { return (float)(rng_next(r) >> 40) * (1.0f / 16777216.0f); }

// Standard normal by the Box-Muller transform (one of the pair is used; simplicity over speed).
inline float rng_normal(Rng& r) {
    double u1 = ((rng_next(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);  // (0, 1]: log is finite
    double u2 = (rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
