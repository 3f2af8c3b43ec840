// libFuzzer harness of the run log appender's parser (llmc/runlog_append.h): runlog_check_existing,
// which checks the preamble and header (runlog_check_header) and finds where the intact records
// end and the continuations its header and notes record, as runlog_open_append does before it appends; and runlog_scan, the scan over damaged
// records, against a plain re-implementation of the readers' rule that checks every record's CRC
// directly (quadratic, fine for inputs of a few kilobytes).
// Input: a switch byte (fuzz.h: kFixHeaderCrc, kFixPayloadCrc), then the file.
// Seeds: test/fuzz/make_seeds.cpp, logs of fuzz_log_config() written by runlog_create and the
// record writers.
#include "llmc/runlog_append.h"
#include "fuzz.h"

// The readers' rule, plainly (docs/log_format.md, "Reading", 4 to 6).
static RunLogScan reference_scan(const std::vector<uint8_t>& d, size_t pos) {
    RunLogScan scan = {pos, -1, {}};
    while (pos < d.size()) {
        size_t size = runlog_intact_size(d, pos);
        if (size) {
            memcpy(&scan.last_step, &d[pos + 12], 8);
            runlog_keep_note(&d[pos], size, scan);
            pos += size;
            scan.intact_end = pos;
            continue;
        }
        auto next = std::search(d.begin() + pos + 1, d.end(), kRecordMarker, kRecordMarker + 4);
        if (next == d.end()) break;
        pos = next - d.begin();
    }
    return scan;
}

// Sets the CRC of every record that frames, hopping from frame to frame (and to the next marker
// after bytes that do not frame a record).
static void fix_record_crcs(std::vector<uint8_t>& d, size_t pos) {
    while (pos + kRecordOverhead <= d.size()) {
        if (memcmp(&d[pos], kRecordMarker, 4) != 0) {
            auto next = std::search(d.begin() + pos + 1, d.end(), kRecordMarker, kRecordMarker + 4);
            pos = next - d.begin();
            continue;
        }
        uint32_t payload_bytes;
        memcpy(&payload_bytes, &d[pos + 8], 4);
        size_t crc_at = pos + kFrameBytes + payload_bytes;
        if (crc_at + 4 > d.size()) return;
        put_u32(d, crc_at, crc32_of(&d[pos + 4], crc_at - pos - 4));
        pos = crc_at + 4;
    }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    uint8_t switches = data[0];
    std::vector<uint8_t> file(data + 1, data + size);
    size_t records_start = kPreambleBytes;
    if (file.size() >= kPreambleBytes) {
        uint32_t header_bytes;
        memcpy(&header_bytes, &file[12], 4);
        if (kPreambleBytes + header_bytes <= file.size()) {
            records_start += header_bytes;
            if (switches & kFixHeaderCrc) put_u32(file, 16, crc32_of(&file[kPreambleBytes], header_bytes));
        }
    }
    if (switches & kFixPayloadCrc) fix_record_crcs(file, records_start);
    MemFile f(file);
    RunLog log;
    log.path = "fuzz.attnlog";
    log.fd = f.fd;
    expect_accept_or_reject([&] {
        size_t file_size;
        RunLineage lineage;
        RunLogScan scan = runlog_check_existing(log, fuzz_log_config(), &file_size, &lineage);
        if (file_size != file.size() || scan.intact_end < records_start || scan.intact_end > file.size()) __builtin_trap();
    });
    // The linear scan finds what the plain rule finds, from anywhere.
    size_t from = std::min(records_start, file.size());
    RunLogScan fast = runlog_scan(file, from), plain = reference_scan(file, from);
    if (fast.intact_end != plain.intact_end || fast.last_step != plain.last_step || fast.notes != plain.notes) __builtin_trap();
    return 0;
}
