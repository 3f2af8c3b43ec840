// JSON for the run log's header: writing text (strings, floats, 64-bit ids) and a strict parser
// that reads it back, so that a resumed run checks the header of the log it appends to with
// nothing but this header (no library), accepting exactly what scripts/attnlog.py accepts.
#pragma once
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>
#include "utils.h"

// ---------------------------------------------------------------------------------------------
// Writing

// Replaces every byte sequence that is not valid UTF-8 with U+FFFD, so the header stays valid JSON
// and notes stay valid text whatever bytes an option or a path holds.
inline std::string utf8_sanitized(const std::string& s) {
    std::string out;
    size_t i = 0, n = s.size();
    while (i < n) {
        unsigned char c = s[i];
        size_t len = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3
                   : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        bool ok = len > 0 && i + len <= n;
        for (size_t k = 1; ok && k < len; k++) ok = ((unsigned char)s[i + k] & 0xC0) == 0x80;
        if (ok && len >= 3) {  // no overlong forms, no UTF-16 surrogates, nothing above U+10FFFF
            unsigned char c1 = s[i + 1];
            ok = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 > 0x9F) && !(c == 0xF0 && c1 < 0x90) &&
                 !(c == 0xF4 && c1 > 0x8F);
        }
        if (ok) {
            out.append(s, i, len);
            i += len;
        } else {
            out += "\xEF\xBF\xBD";
            i++;
        }
    }
    return out;
}

inline std::string json_string(const std::string& s) {
    std::string out = "\"";
    for (char ch : utf8_sanitized(s)) {
        unsigned char c = ch;
        if (c == '"') out += "\\\"";
        else if (c == '\\') out += "\\\\";
        else if (c == '\n') out += "\\n";
        else if (c == '\r') out += "\\r";
        else if (c == '\t') out += "\\t";
        else if (c < 0x20) out += strprintf("\\u%04x", c);
        else out += ch;
    }
    return out + "\"";
}

// The shortest decimal that reads back as the same float, always with a '.' or an exponent so
// that JSON readers see a float.
inline std::string json_float(float v) {
    std::string s;
    for (int digits = 6; digits <= 9; digits++) {
        s = strprintf("%.*g", digits, v);
        if (strtof(s.c_str(), nullptr) == v) break;
    }
    if (s.find_first_of(".e") == std::string::npos) s += ".0";
    return s;
}

// An id as JSON text: 16 hexadecimal digits in a string (a JSON number would lose bits).
inline std::string json_id(uint64_t id) { return strprintf("\"%016" PRIx64 "\"", id); }

// ---------------------------------------------------------------------------------------------
// Reading

// A strict JSON parser: RFC 8259 and nothing more, and none of what scripts/attnlog.py refuses
// besides (integers of more than 4300 digits, floats too large for a double, lone surrogates,
// nesting deeper than 64), so that the appender accepts no header the reader rejects.
struct JsonValue {
    enum Kind { NUL, BOOL, NUMBER, STRING, ARRAY, OBJECT };
    Kind kind = NUL;
    std::string text;                                        // a string decoded; a number as written; true, false
    std::vector<JsonValue> items;                            // an array's
    std::vector<std::pair<std::string, JsonValue>> members;  // an object's, in file order

    // The member named `key`, the last one when the name repeats (as json.loads keeps it), else nullptr.
    const JsonValue* get(const std::string& key) const {
        for (size_t i = members.size(); i-- > 0;)
            if (members[i].first == key) return &members[i].second;
        return nullptr;
    }
};

static const int kJsonMaxDepth = 64;             // the header nests 5 deep
static const size_t kJsonMaxIntegerDigits = 4300;  // Python's int() refuses longer ones

struct JsonParser {
    const std::string& s;
    size_t i = 0;
    int depth = 0;

    bool at(char c) const { return i < s.size() && s[i] == c; }
    bool digit() const { return i < s.size() && s[i] >= '0' && s[i] <= '9'; }
    void skip_space() {
        while (at(' ') || at('\t') || at('\n') || at('\r')) i++;
    }
    bool hex4(uint32_t& u) {
        if (i + 4 > s.size()) return false;
        u = 0;
        for (int k = 0; k < 4; k++) {
            char c = s[i++];
            int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (v < 0) return false;
            u = u * 16 + (uint32_t)v;
        }
        return true;
    }
    static void put_utf8(std::string& out, uint32_t u) {
        if (u < 0x80) {
            out += (char)u;
        } else if (u < 0x800) {
            out += (char)(0xC0 | u >> 6);
            out += (char)(0x80 | (u & 0x3F));
        } else if (u < 0x10000) {
            out += (char)(0xE0 | u >> 12);
            out += (char)(0x80 | (u >> 6 & 0x3F));
            out += (char)(0x80 | (u & 0x3F));
        } else {
            out += (char)(0xF0 | u >> 18);
            out += (char)(0x80 | (u >> 12 & 0x3F));
            out += (char)(0x80 | (u >> 6 & 0x3F));
            out += (char)(0x80 | (u & 0x3F));
        }
    }
    bool string(std::string& out) {  // from the opening quote to just past the closing one
        for (i++; i < s.size();) {
            unsigned char c = s[i++];
            if (c == '"') return true;
            if (c < 0x20) return false;  // control characters must be escaped
            if (c != '\\') {
                out += (char)c;
                continue;
            }
            if (i >= s.size()) return false;
            char e = s[i++];
            static const char escapes[] = "\"\\/bfnrt", meanings[] = "\"\\/\b\f\n\r\t";
            const char* plain = e ? strchr(escapes, e) : nullptr;
            if (plain) {
                out += meanings[plain - escapes];
                continue;
            }
            uint32_t u, low;
            if (e != 'u' || !hex4(u)) return false;
            if (u >= 0xD800 && u < 0xDC00) {  // the first of a surrogate pair: the second must follow
                if (s.compare(i, 2, "\\u") != 0) return false;
                i += 2;
                if (!hex4(low) || low < 0xDC00 || low >= 0xE000) return false;
                u = 0x10000 + ((u - 0xD800) << 10) + (low - 0xDC00);
            } else if (u >= 0xDC00 && u < 0xE000) {
                return false;  // a lone surrogate is no Unicode text
            }
            put_utf8(out, u);
        }
        return false;
    }
    bool number(std::string& out) {
        size_t start = i;
        if (at('-')) i++;
        if (at('0')) i++;
        else if (digit()) while (digit()) i++;
        else return false;
        bool integer = true;
        if (at('.')) {
            i++;
            if (!digit()) return false;
            while (digit()) i++;
            integer = false;
        }
        if (at('e') || at('E')) {
            i++;
            if (at('+') || at('-')) i++;
            if (!digit()) return false;
            while (digit()) i++;
            integer = false;
        }
        out = s.substr(start, i - start);
        if (integer) return out.size() - (out[0] == '-') <= kJsonMaxIntegerDigits;
        return std::isfinite(strtod(out.c_str(), nullptr));  // 1e999 is too large for a float
    }
    bool value(JsonValue& v) {
        skip_space();
        if (i >= s.size()) return false;
        char c = s[i];
        if (c == '"') {
            v.kind = JsonValue::STRING;
            return string(v.text);
        }
        if (c == '-' || (c >= '0' && c <= '9')) {
            v.kind = JsonValue::NUMBER;
            return number(v.text);
        }
        for (const char* word : {"true", "false", "null"})
            if (s.compare(i, strlen(word), word) == 0) {
                i += strlen(word);
                v.kind = word[0] == 'n' ? JsonValue::NUL : JsonValue::BOOL;
                v.text = word;
                return true;
            }
        if (c != '[' && c != '{') return false;
        if (++depth > kJsonMaxDepth) return false;
        bool object = c == '{';
        v.kind = object ? JsonValue::OBJECT : JsonValue::ARRAY;
        i++;
        skip_space();
        if (at(object ? '}' : ']')) {
            i++;
            depth--;
            return true;
        }
        while (true) {
            JsonValue item;
            if (object) {
                skip_space();
                std::string key;
                if (!at('"') || !string(key)) return false;
                skip_space();
                if (!at(':')) return false;
                i++;
                if (!value(item)) return false;
                v.members.emplace_back(std::move(key), std::move(item));
            } else {
                if (!value(item)) return false;
                v.items.push_back(std::move(item));
            }
            skip_space();
            if (at(',')) {
                i++;
                continue;
            }
            if (!at(object ? '}' : ']')) return false;
            i++;
            depth--;
            return true;
        }
    }
};

// Parses one JSON value that is the whole of `text` (whitespace around it allowed), which must
// be valid UTF-8. Returns false on anything else.
inline bool json_parse(const std::string& text, JsonValue& out) {
    if (utf8_sanitized(text) != text) return false;
    JsonParser parser{text};
    if (!parser.value(out)) return false;
    parser.skip_space();
    return parser.i == text.size();
}

// Compact JSON text of a value, for messages.
inline std::string json_text(const JsonValue& v) {
    switch (v.kind) {
        case JsonValue::STRING: return json_string(v.text);
        case JsonValue::ARRAY: {
            std::string j = "[";
            for (size_t k = 0; k < v.items.size(); k++) j += (k ? ", " : "") + json_text(v.items[k]);
            return j + "]";
        }
        case JsonValue::OBJECT: {
            std::string j = "{";
            for (size_t k = 0; k < v.members.size(); k++)
                j += (k ? ", " : "") + json_string(v.members[k].first) + ": " + json_text(v.members[k].second);
            return j + "}";
        }
        default: return v.kind == JsonValue::NUL ? "null" : v.text;
    }
}

// Whether both exist and read the same (as compact text).
inline bool json_equal(const JsonValue* a, const JsonValue* b) {
    return a && b && json_text(*a) == json_text(*b);
}

// A number written without a fraction or an exponent.
inline bool json_is_integer(const JsonValue* v) {
    return v && v->kind == JsonValue::NUMBER && v->text.find_first_of(".eE") == std::string::npos;
}

// An id written by json_id, else 0.
inline uint64_t json_to_id(const JsonValue* v) {
    if (!v || v->kind != JsonValue::STRING || v->text.size() != 16) return 0;
    uint64_t id = 0;
    for (char ch : v->text) {
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
        if (d < 0) return 0;
        id = id << 4 | (uint64_t)d;
    }
    return id;
}
