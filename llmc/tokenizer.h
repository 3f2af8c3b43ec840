// A thin wrapper around a SentencePiece model (tokenizer.model, written by dataprep.h).
//
// Text is encoded one line at a time and the lines are joined by the newline byte token <0x0A>.
// SentencePiece marks the start of every word with '▁' (a space) and adds one such space in front
// of the text it encodes; encoding each line on its own gives the first word of a line the same
// piece it has everywhere else ("▁The", not "T" "he"). Decoding removes that one space again.
// Link with -lsentencepiece.
#pragma once
#include <sentencepiece_processor.h>
#include <string>
#include <vector>

#include "utils.h"

struct Tokenizer {
    sentencepiece::SentencePieceProcessor sp;
    std::string path;
    int newline_id = -1;  // the byte piece <0x0A>
};

inline void tokenizer_load(Tokenizer* t, const std::string& path) {
    if (!file_exists(path)) fail("%s: cannot open (%s)", path.c_str(), strerror(ENOENT));
    if (!t->sp.Load(path).ok()) fail("%s: not a readable SentencePiece model", path.c_str());
    t->path = path;
    t->newline_id = t->sp.PieceToId("<0x0A>");
    if (t->newline_id == t->sp.unk_id())
        fail("%s: the model has no byte pieces; train it with byte_fallback so any text can be encoded", path.c_str());
    if (t->sp.bos_id() < 0) fail("%s: the model has no beginning-of-sequence piece", path.c_str());
}

inline int tokenizer_vocab_size(const Tokenizer* t) { return t->sp.GetPieceSize(); }

// The id that starts every document in the shards.
inline int tokenizer_bos_id(const Tokenizer* t) { return t->sp.bos_id(); }

inline std::vector<int> tokenizer_encode(const Tokenizer* t, const std::string& text) {
    std::vector<int> ids, line_ids;
    size_t start = 0;
    while (true) {
        size_t end = text.find('\n', start);
        std::string line = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
        if (!line.empty()) {
            auto status = t->sp.Encode(line, &line_ids);
            if (!status.ok()) fail("%s: cannot encode text (%s)", t->path.c_str(), status.ToString().c_str());
            ids.insert(ids.end(), line_ids.begin(), line_ids.end());
        }
        if (end == std::string::npos) break;
        ids.push_back(t->newline_id);
        start = end + 1;
    }
    return ids;
}

// The beginning-of-sequence id decodes to nothing.
inline std::string tokenizer_decode(const Tokenizer* t, const std::vector<int>& ids) {
    for (int id : ids)
        if (id < 0 || id >= tokenizer_vocab_size(t))
            fail("%s: cannot decode token id %d: outside the vocabulary of %d", t->path.c_str(), id, tokenizer_vocab_size(t));
    std::string text;
    auto status = t->sp.Decode(ids, &text);
    if (!status.ok()) fail("%s: cannot decode tokens (%s)", t->path.c_str(), status.ToString().c_str());
    std::string out;  // the same text without the one space that encoding put at the start of each line
    for (size_t i = 0; i < text.size(); i++)
        if (!(text[i] == ' ' && i > 0 && text[i - 1] == '\n')) out += text[i];
    return out;
}
