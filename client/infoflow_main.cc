// `infoflow`: one binary, subcommands dispatched by name.
#include <cstdio>
#include <cstring>

#include "client/commands.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* help;
};

const Command kCommands[] = {
    {"tokenize", infoflow::cli::RunTokenize,
     "encode a JSON array of strings (stdin) with a tokenizer.json"},
    {"generate", infoflow::cli::RunGenerate,
     "in-process generation from a model directory (no server)"},
    {"ingest", infoflow::cli::RunIngest, "store chunk KV of files on a server (gRPC)"},
    {"query", infoflow::cli::RunQuery, "ask a question over stored chunks (gRPC, streams)"},
    {"stats", infoflow::cli::RunStats, "model info and store statistics of a server"},
    {"export-gguf", infoflow::cli::RunExportGguf,
     "write a model directory as GGUF for llama.cpp (no server)"},
};

void PrintUsage(FILE* out) {
  std::fprintf(out, "usage: infoflow <command> [flags]\n\ncommands:\n");
  for (const Command& c : kCommands) std::fprintf(out, "  %-11s %s\n", c.name, c.help);
  std::fprintf(out, "\nRun 'infoflow <command> --help' for the flags of one command.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    PrintUsage(stderr);
    return 2;
  }
  if (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    PrintUsage(stdout);
    return 0;
  }
  for (const Command& c : kCommands) {
    if (!std::strcmp(argv[1], c.name)) return c.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "infoflow: unknown command '%s'\n\n", argv[1]);
  PrintUsage(stderr);
  return 2;
}
