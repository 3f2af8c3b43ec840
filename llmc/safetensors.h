// Reader of safetensors files, the weight format of Hugging Face checkpoints:
//   u64 N (little-endian) | N bytes of JSON header | data
// The header is an object naming each tensor: {"name": {"dtype": "BF16", "shape": [rows, cols],
// "data_offsets": [begin, end]}, ...}, with an optional "__metadata__" object of strings. The
// offsets count from the first byte after the header; the tensors, in offset order, cover the data
// exactly, without overlaps or holes. F32, F16 and BF16 tensors are read, as float32 (exactly:
// every half and bfloat16 value is a float32 value).
//
// Everything the header says is checked against the file before any of it is believed, so a file
// that is truncated or lies about its offsets, shapes or dtypes stops with one line naming the file
// and what is wrong, and no allocation is larger than what the file holds.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>
#include "json.h"
#include "utils.h"

enum SafetensorsDtype { ST_F32, ST_F16, ST_BF16, ST_NUM_DTYPES };
static const char* const kSafetensorsDtypeNames[ST_NUM_DTYPES] = {"F32", "F16", "BF16"};
static const uint64_t kSafetensorsDtypeBytes[ST_NUM_DTYPES] = {4, 2, 2};

// The format's own reader refuses larger headers; a model's is some kilobytes.
static const uint64_t kSafetensorsMaxHeaderBytes = 100000000;

struct SafetensorsTensor {
    std::string name;
    std::string path;  // the file that holds it
    int dtype = ST_F32;
    std::vector<uint64_t> shape;
    uint64_t numel = 1;
    uint64_t offset = 0, bytes = 0;  // where its data lies in the file, from the file's start
};

// A shape as text: "[151936, 1024]".
inline std::string shape_text(const std::vector<uint64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

// A JSON number that is a whole number from 0 to 2^64 - 1, into *out.
inline bool json_to_u64(const JsonValue& v, uint64_t* out) {
    if (!json_is_integer(&v) || v.text[0] == '-' || v.text.size() > 20) return false;
    uint64_t x = 0;
    for (char ch : v.text) {
        uint64_t digit = (uint64_t)(ch - '0');
        if (x > (UINT64_MAX - digit) / 10) return false;
        x = x * 10 + digit;
    }
    *out = x;
    return true;
}

// One tensor's entry of the header, checked on its own: a known dtype, a shape of whole numbers,
// two offsets inside the data that span exactly the bytes the shape and dtype need.
inline SafetensorsTensor safetensors_entry(const char* path, const std::string& name, const JsonValue& entry,
                                           uint64_t data_start, uint64_t data_bytes) {
    SafetensorsTensor t;
    t.name = name;
    t.path = path;
    const char* n = name.c_str();
    if (entry.kind != JsonValue::OBJECT) fail("%s: tensor %s: its header entry is not an object", path, n);
    const JsonValue* dtype = entry.get("dtype");
    const JsonValue* shape = entry.get("shape");
    const JsonValue* offsets = entry.get("data_offsets");
    if (!dtype || dtype->kind != JsonValue::STRING) fail("%s: tensor %s has no dtype", path, n);
    t.dtype = 0;
    while (t.dtype < ST_NUM_DTYPES && dtype->text != kSafetensorsDtypeNames[t.dtype]) t.dtype++;
    if (t.dtype == ST_NUM_DTYPES)
        fail("%s: tensor %s has dtype %s; weights are read from F32, F16 or BF16", path, n, json_text(*dtype).c_str());
    if (!shape || shape->kind != JsonValue::ARRAY) fail("%s: tensor %s has no shape (a list of sizes)", path, n);
    uint64_t itemsize = kSafetensorsDtypeBytes[t.dtype];
    bool too_large = false;
    for (const JsonValue& size : shape->items) {
        uint64_t d;
        if (!json_to_u64(size, &d)) fail("%s: tensor %s: shape %s holds %s, not a size", path, n, json_text(*shape).c_str(),
                                         json_text(size).c_str());
        t.shape.push_back(d);
        too_large = too_large || __builtin_mul_overflow(t.numel, d, &t.numel);
    }
    if (too_large || t.numel > data_bytes / itemsize)
        fail("%s: tensor %s: shape %s of %s needs more bytes than the file's %llu of data", path, n,
             shape_text(t.shape).c_str(), kSafetensorsDtypeNames[t.dtype], (unsigned long long)data_bytes);
    uint64_t begin, end;
    if (!offsets || offsets->kind != JsonValue::ARRAY || offsets->items.size() != 2 || !json_to_u64(offsets->items[0], &begin) ||
        !json_to_u64(offsets->items[1], &end))
        fail("%s: tensor %s has no data_offsets [begin, end]", path, n);
    if (begin > end) fail("%s: tensor %s: data_offsets [%llu, %llu] end before they begin", path, n, (unsigned long long)begin,
                          (unsigned long long)end);
    if (end > data_bytes)
        fail("%s: tensor %s: data_offsets [%llu, %llu] run past the file's %llu bytes of data: truncated, or the header lies",
             path, n, (unsigned long long)begin, (unsigned long long)end, (unsigned long long)data_bytes);
    t.bytes = end - begin;
    if (t.bytes != t.numel * itemsize)
        fail("%s: tensor %s: data_offsets [%llu, %llu] span %llu bytes; shape %s of %s is %llu", path, n,
             (unsigned long long)begin, (unsigned long long)end, (unsigned long long)t.bytes, shape_text(t.shape).c_str(),
             kSafetensorsDtypeNames[t.dtype], (unsigned long long)(t.numel * itemsize));
    t.offset = data_start + begin;
    return t;
}

// The tensors of a safetensors file, in the order of their data, every entry of the header checked
// and the data covered exactly. Fails with one line naming the file for anything else.
inline std::vector<SafetensorsTensor> safetensors_read_header(const std::string& file) {
    const char* path = file.c_str();
    ScopedFile f(open_or_fail(path, "rb"));
    uint64_t size = (uint64_t)file_size_or_fail(path), header_bytes = 0;
    uint8_t prefix[8];
    if (size < 8) fail("%s: truncated: %llu bytes, not even the 8 of the header's length", path, (unsigned long long)size);
    read_or_fail(f, prefix, 8, path, "the header's length");
    for (int i = 7; i >= 0; i--) header_bytes = header_bytes << 8 | prefix[i];
    if (header_bytes > size - 8)
        fail("%s: the header's length %llu runs past the end of the file (%llu bytes): truncated, or not a safetensors file",
             path, (unsigned long long)header_bytes, (unsigned long long)size);
    if (header_bytes > kSafetensorsMaxHeaderBytes)
        fail("%s: the header's length %llu is above the format's limit of %llu bytes", path, (unsigned long long)header_bytes,
             (unsigned long long)kSafetensorsMaxHeaderBytes);
    std::string text(header_bytes, '\0');
    read_or_fail(f, &text[0], header_bytes, path, "the header");
    JsonValue header;
    if (!json_parse(text, header) || header.kind != JsonValue::OBJECT) fail("%s: the header is not a JSON object", path);
    uint64_t data_start = 8 + header_bytes, data_bytes = size - data_start;
    std::vector<SafetensorsTensor> tensors;
    for (const auto& [name, entry] : header.members) {
        if (name != "__metadata__") tensors.push_back(safetensors_entry(path, name, entry, data_start, data_bytes));
        else if (entry.kind != JsonValue::OBJECT) fail("%s: __metadata__ is not an object", path);
    }
    std::sort(tensors.begin(), tensors.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
        return a.offset != b.offset ? a.offset < b.offset : a.bytes < b.bytes;
    });
    uint64_t covered = data_start;  // the data up to here belongs to the tensors before
    for (size_t i = 0; i < tensors.size(); i++) {
        const SafetensorsTensor& t = tensors[i];
        if (t.offset < covered)
            fail("%s: tensors %s and %s overlap", path, tensors[i - 1].name.c_str(), t.name.c_str());
        if (t.offset > covered)
            fail("%s: data bytes [%llu, %llu) before tensor %s belong to no tensor", path,
                 (unsigned long long)(covered - data_start), (unsigned long long)(t.offset - data_start), t.name.c_str());
        covered += t.bytes;
    }
    if (covered != size)
        fail("%s: the last %llu bytes of the file belong to no tensor", path, (unsigned long long)(size - covered));
    std::vector<const SafetensorsTensor*> by_name;
    for (const SafetensorsTensor& t : tensors) by_name.push_back(&t);
    std::sort(by_name.begin(), by_name.end(), [](const SafetensorsTensor* a, const SafetensorsTensor* b) { return a->name < b->name; });
    for (size_t i = 1; i < by_name.size(); i++)
        if (by_name[i]->name == by_name[i - 1]->name) fail("%s: tensor %s is named twice", path, by_name[i]->name.c_str());
    return tensors;
}

// The float32 value of IEEE half-precision bits: normal, subnormal, zero, infinity and NaN.
inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = h >> 10 & 0x1F, mantissa = h & 0x3FF;
    float magnitude;
    if (exponent == 0) magnitude = ldexpf((float)mantissa, -24);  // subnormal (or zero): mantissa * 2^-24
    else if (exponent == 31) magnitude = mantissa ? NAN : INFINITY;
    else magnitude = ldexpf((float)(mantissa | 0x400), (int)exponent - 25);
    uint32_t bits;
    memcpy(&bits, &magnitude, 4);
    bits |= sign;
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

// The float32 value of bfloat16 bits: the upper half of a float32.
inline float bfloat16_to_float(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

// Reads a tensor's values as float32, a chunk at a time: each chunk goes to chunk(values, first, n),
// values[0, n) being elements [first, first + n) of the tensor. Scratch memory stays at a chunk.
template <typename Chunk>
inline void safetensors_read_chunks(const SafetensorsTensor& t, Chunk chunk) {
    const char* path = t.path.c_str();
    ScopedFile f(open_or_fail(path, "rb"));
    if (fseeko(f, (off_t)t.offset, SEEK_SET) != 0) fail("%s: cannot seek to tensor %s", path, t.name.c_str());
    const uint64_t kChunk = 1 << 20, itemsize = kSafetensorsDtypeBytes[t.dtype];
    std::vector<uint8_t> raw((size_t)(std::min(kChunk, t.numel) * itemsize));
    std::vector<float> values((size_t)std::min(kChunk, t.numel));
    std::string what = "tensor " + t.name;
    for (uint64_t first = 0; first < t.numel; first += kChunk) {
        size_t n = (size_t)std::min(kChunk, t.numel - first);
        read_or_fail(f, raw.data(), n * itemsize, path, what.c_str());
        if (t.dtype == ST_F32) memcpy(values.data(), raw.data(), n * 4);  // little-endian, as this machine
        for (size_t i = 0; t.dtype != ST_F32 && i < n; i++) {
            uint16_t h = (uint16_t)(raw[2 * i] | raw[2 * i + 1] << 8);
            values[i] = t.dtype == ST_F16 ? half_to_float(h) : bfloat16_to_float(h);
        }
        chunk(values.data(), first, n);
    }
}

// Reads a tensor into dst (t.numel floats). A value that is not finite is refused: no model's
// weight is, and it would only turn every later number into NaN.
inline void safetensors_read(const SafetensorsTensor& t, float* dst) {
    safetensors_read_chunks(t, [&](const float* values, uint64_t first, size_t n) {
        for (size_t i = 0; i < n; i++)
            if (!std::isfinite(values[i]))
                fail("%s: tensor %s holds %g at element %llu", t.path.c_str(), t.name.c_str(), values[i],
                     (unsigned long long)(first + i));
        memcpy(dst + first, values, n * sizeof(float));
    });
}
