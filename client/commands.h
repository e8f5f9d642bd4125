// Subcommands of the `infoflow` CLI. Each lives in its own cmd_<name>.cc and
// receives argv with the subcommand name removed (argv[0] is the subcommand).
// Returns the process exit code: 0 success, 1 runtime failure, 2 usage error.
#ifndef INFOFLOW_CLIENT_COMMANDS_H_
#define INFOFLOW_CLIENT_COMMANDS_H_

namespace infoflow::cli {

int RunTokenize(int argc, char** argv);
int RunGenerate(int argc, char** argv);
int RunIngest(int argc, char** argv);  // gRPC client: cmd_ingest.cc
int RunQuery(int argc, char** argv);   // cmd_query.cc
int RunStats(int argc, char** argv);   // cmd_stats.cc
int RunExportGguf(int argc, char** argv);  // cmd_export_gguf.cc

}  // namespace infoflow::cli

#endif  // INFOFLOW_CLIENT_COMMANDS_H_
