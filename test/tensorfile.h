// Reader of the named-tensor files that test/reference.py writes (write_tensorfile there):
// magic "ATTNTNSR", u32 version, u32 count, then per tensor: u16 name length, name, u8 dtype
// (0 float32, 1 int32, 2 float64), u8 ndim, i64 dims[ndim], little-endian data.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>
#include "../llmc/utils.h"

struct NamedTensor {
    std::vector<int64_t> shape;
    std::vector<double> values;  // every dtype widened to double
    size_t numel() const { return values.size(); }
};

inline std::map<std::string, NamedTensor> read_tensorfile(const std::string& path) {
    FILE* f = open_or_fail(path.c_str(), "rb");
    char magic[8];
    uint32_t version, count;
    read_or_fail(f, magic, 8, path.c_str(), "the magic");
    if (memcmp(magic, "ATTNTNSR", 8) != 0) fail("%s: not a tensor file", path.c_str());
    read_or_fail(f, &version, 4, path.c_str(), "the version");
    read_or_fail(f, &count, 4, path.c_str(), "the count");
    std::map<std::string, NamedTensor> out;
    for (uint32_t k = 0; k < count; k++) {
        uint16_t len;
        read_or_fail(f, &len, 2, path.c_str(), "a name length");
        std::string name(len, '\0');
        read_or_fail(f, &name[0], len, path.c_str(), "a name");
        uint8_t dtype, ndim;
        read_or_fail(f, &dtype, 1, path.c_str(), "a dtype");
        read_or_fail(f, &ndim, 1, path.c_str(), "a rank");
        NamedTensor t;
        t.shape.resize(ndim);
        read_or_fail(f, t.shape.data(), 8 * (size_t)ndim, path.c_str(), "a shape");
        size_t n = 1;
        for (int64_t d : t.shape) n *= (size_t)d;
        t.values.resize(n);
        if (dtype == 0 || dtype == 1) {
            std::vector<uint32_t> raw(n);
            read_or_fail(f, raw.data(), 4 * n, path.c_str(), name.c_str());
            for (size_t i = 0; i < n; i++) {
                if (dtype == 0) {
                    float v;
                    memcpy(&v, &raw[i], 4);
                    t.values[i] = v;
                } else {
                    t.values[i] = (double)(int32_t)raw[i];
                }
            }
        } else if (dtype == 2) {
            read_or_fail(f, t.values.data(), 8 * n, path.c_str(), name.c_str());
        } else {
            fail("%s: tensor %s has unknown dtype %d", path.c_str(), name.c_str(), dtype);
        }
        out[name] = std::move(t);
    }
    fclose(f);
    return out;
}

inline const NamedTensor& tensor_or_fail(const std::map<std::string, NamedTensor>& m, const std::string& name,
                                         const std::string& path) {
    auto it = m.find(name);
    if (it == m.end()) fail("%s: no tensor named %s", path.c_str(), name.c_str());
    return it->second;
}
