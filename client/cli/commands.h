// commands.h: the `conveyor` subcommands. Each Register* adds a CLI11 subcommand whose
// callback runs the command and stores its exit status in *exit_code.
#pragma once

#include <CLI/CLI.hpp>

namespace conveyor::cli {

void RegisterInspect(CLI::App& app, int* exit_code);
void RegisterIndex(CLI::App& app, int* exit_code);
void RegisterDump(CLI::App& app, int* exit_code);
void RegisterBench(CLI::App& app, int* exit_code);
void RegisterConvert(CLI::App& app, int* exit_code);
#ifdef CONVEYOR_HAVE_SERVICE
void RegisterSubscribe(CLI::App& app, int* exit_code);
void RegisterHealth(CLI::App& app, int* exit_code);
void RegisterDatasets(CLI::App& app, int* exit_code);
#endif

}  // namespace conveyor::cli
