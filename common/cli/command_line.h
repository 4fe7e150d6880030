// command_line.h: command-line parsing (CLI11) shared by `conveyor` and `conveyord`, with
// errors a person can act on: one line on stderr, the closest valid command or option
// suggested, exit status 2 (a usage error), never CLI11's own exit codes (100-115).
#pragma once

#include <optional>

#include <CLI/CLI.hpp>

namespace conveyor::cli {

// Parses argv into `app` (and its subcommands). Returns std::nullopt when the program goes
// on. Otherwise returns the exit status to end with: 0 after --help or --version (printed on
// stdout), 2 after a usage error, printed as one line on stderr, e.g.
//   conveyor dump: unknown option '--thread' (did you mean '--threads'?); see 'conveyor dump --help'
std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv);

// Exit statuses of conveyor's programs: 0 success, 1 a failure (bad data, an unreachable
// daemon, a refused request), 2 a usage error (the command line itself is wrong).
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

}  // namespace conveyor::cli
