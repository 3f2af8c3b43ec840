// Where the intact records of a run log end (docs/log_format.md, "Reading"): the records a reader
// takes, found the way readers find them, in time linear in the file's size however damaged it
// is. A resumed run appends after the last intact record (runlog_append.h).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>
#include "runlog.h"
#include "utils.h"

// CRC-32 arithmetic (zlib's crc32_combine): a * b modulo the CRC polynomial, bits reflected.
inline uint32_t crc32_multiply(uint32_t a, uint32_t b) {
    uint32_t product = 0;
    for (uint32_t m = 1u << 31; m; m >>= 1) {
        if (a & m) product ^= b;
        b = b & 1 ? (b >> 1) ^ 0xEDB88320u : b >> 1;
    }
    return product;
}

// x^(8n) modulo the polynomial: crc32(A + B) = crc32_multiply(crc32_x8n(len(B)), crc32(A)) ^ crc32(B).
inline uint32_t crc32_x8n(uint64_t n) {
    struct Squares {
        uint32_t v[64];  // x^(8 * 2^k)
        Squares() {
            v[0] = 1u << 23;  // x^8
            for (int k = 1; k < 64; k++) v[k] = crc32_multiply(v[k - 1], v[k - 1]);
        }
    };
    static const Squares squares;
    uint32_t power = 1u << 31;  // x^0
    for (int k = 0; n; k++, n >>= 1)
        if (n & 1) power = crc32_multiply(power, squares.v[k]);
    return power;
}

// The CRC-32 of any byte range of a buffer in time independent of the range's length, from the
// CRCs of the prefixes that end at multiples of kBlock bytes: crc(a..b) = crc(0..b) ^ crc(0..a)
// shifted by b - a bytes. What keeps a scan over candidate records that overlap linear.
struct RangeCrc {
    static const size_t kBlock = 256;
    const uint8_t* data;
    std::vector<uint32_t> prefix;  // prefix[k]: the CRC of the first k * kBlock bytes

    explicit RangeCrc(const std::vector<uint8_t>& d) : data(d.data()), prefix(d.size() / kBlock + 1) {
        for (size_t k = 1; k < prefix.size(); k++) prefix[k] = crc32_update(prefix[k - 1], data + (k - 1) * kBlock, kBlock);
    }
    uint32_t up_to(size_t end) const {
        size_t k = end / kBlock;
        return crc32_update(prefix[k], data + k * kBlock, end - k * kBlock);
    }
    uint32_t of(size_t begin, size_t end) const {
        return up_to(end) ^ crc32_multiply(crc32_x8n(end - begin), up_to(begin));
    }
};

// Size of the record at `pos` when its marker, length and checksum agree, else 0. The checksum
// comes from `ranges` when given, else it is computed over the record.
inline size_t runlog_intact_size(const std::vector<uint8_t>& d, size_t pos, const RangeCrc* ranges = nullptr) {
    if (pos + kRecordOverhead > d.size() || memcmp(&d[pos], kRecordMarker, 4) != 0) return 0;
    uint32_t payload_bytes, crc;
    memcpy(&payload_bytes, &d[pos + 8], 4);
    size_t crc_at = pos + kFrameBytes + payload_bytes;
    if (crc_at + 4 > d.size()) return 0;
    memcpy(&crc, &d[crc_at], 4);
    uint32_t actual = ranges ? ranges->of(pos + 4, crc_at) : crc32_of(&d[pos + 4], crc_at - pos - 4);
    return actual == crc ? crc_at + 4 - pos : 0;
}

// Where the intact records end, found the way readers find them: after a damaged record reading
// resumes at the next marker that frames an intact record; bytes after the last intact record
// are a torn tail.
struct RunLogScan {
    size_t intact_end;  // just past the last intact record
    int64_t last_step;  // that record's step, -1 when there is none
    std::vector<std::pair<int64_t, std::string>> notes;  // the intact notes' steps and texts, in file order
};

// The step and text of the intact record of `size` bytes at d[pos] when it is a note.
inline void runlog_keep_note(const uint8_t* record, size_t size, RunLogScan& scan) {
    uint16_t type;
    memcpy(&type, record + 4, 2);
    if (type != REC_NOTE) return;
    int64_t step;
    memcpy(&step, record + 12, 8);
    scan.notes.emplace_back(step, std::string((const char*)record + kFrameBytes, size - kRecordOverhead));
}

// Visits every marker from `pos` on, in order, skipping those inside a record taken: the first at
// or after the current position that frames an intact record is the next record a reader takes.
// Each marker costs the same whatever length its frame claims, so a damaged region full of
// markers takes time linear in its size.
inline RunLogScan runlog_scan(const std::vector<uint8_t>& d, size_t pos) {
    RunLogScan scan = {pos, -1, {}};
    RangeCrc ranges(d);
    const uint8_t *begin = d.data(), *end = begin + d.size();
    while (pos < d.size()) {
        const uint8_t* marker = std::search(begin + pos, end, kRecordMarker, kRecordMarker + 4);
        if (marker == end) break;
        pos = marker - begin;
        size_t size = runlog_intact_size(d, pos, &ranges);
        if (!size) {
            pos++;
            continue;
        }
        memcpy(&scan.last_step, &d[pos + 12], 8);
        runlog_keep_note(&d[pos], size, scan);
        pos += size;
        scan.intact_end = pos;
    }
    return scan;
}

// Reads exactly n bytes at `offset` of the log's file.
inline void runlog_read_at(const RunLog& log, void* dst, size_t n, size_t offset) {
    for (size_t got = 0; got < n;) {
        ssize_t r = pread(log.fd, (uint8_t*)dst + got, n - got, (off_t)(offset + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) fail("%s: cannot read (%s)", log.path.c_str(), r < 0 ? strerror(errno) : "the file shrank");
        got += (size_t)r;
    }
}

// The usual case, found by reading frames only: hopping from frame to frame by their lengths ends
// exactly at the end of the file, and the record found last is intact. Then the file ends with an
// intact record, nothing is torn (damage inside earlier records is for readers to skip), and the
// whole file need not be read.
inline bool runlog_ends_intact(const RunLog& log, size_t pos, size_t size, RunLogScan& scan) {
    size_t last = pos;
    uint8_t frame[kFrameBytes];
    std::vector<uint8_t> record;
    scan.notes.clear();
    while (pos + kRecordOverhead <= size) {
        runlog_read_at(log, frame, kFrameBytes, pos);
        uint32_t payload_bytes;
        uint16_t type;
        memcpy(&payload_bytes, frame + 8, 4);
        memcpy(&type, frame + 4, 2);
        last = pos;
        if (type == REC_NOTE && pos + kRecordOverhead + payload_bytes <= size) {  // notes are read whole
            record.resize(kRecordOverhead + payload_bytes);
            runlog_read_at(log, record.data(), record.size(), pos);
            if (runlog_intact_size(record, 0)) runlog_keep_note(record.data(), record.size(), scan);
        }
        pos += kRecordOverhead + payload_bytes;
    }
    if (pos != size) return false;
    record.resize(size - last);  // empty when the log has no records
    runlog_read_at(log, record.data(), record.size(), last);
    if (!record.empty() && !runlog_intact_size(record, 0)) return false;
    scan.intact_end = size;
    scan.last_step = -1;
    if (!record.empty()) memcpy(&scan.last_step, &record[12], 8);
    return true;
}
