#include "common/cli/command_line.h"

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/text/suggest.h"

namespace conveyor::cli {
namespace {

// The deepest subcommand the command line chose ("conveyor dump"), or the program.
CLI::App* ChosenCommand(CLI::App* app) {
  for (CLI::App* sub : app->get_subcommands()) return ChosenCommand(sub);
  return app;
}

std::string CommandPath(const CLI::App* app) {
  std::string path = app->get_name();
  for (const CLI::App* p = app->get_parent(); p != nullptr; p = p->get_parent()) path = p->get_name() + " " + path;
  return path;
}

std::vector<std::string> OptionNames(const CLI::App* app) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : app->get_options()) {
    if (!opt->nonpositional()) continue;
    for (const std::string& l : opt->get_lnames()) names.push_back("--" + l);
    for (const std::string& s : opt->get_snames()) names.push_back("-" + s);
  }
  return names;
}

std::vector<std::string> SubcommandNames(const CLI::App* app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app->get_subcommands([](const CLI::App*) { return true; })) {
    if (!sub->get_name().empty()) names.push_back(sub->get_name());
  }
  return names;
}

// What the extra arguments mean: an unknown command, an unknown option, or a stray value.
std::string DescribeExtras(CLI::App* root, CLI::App* cmd, const std::vector<std::string>& extras) {
  const std::string& first = extras.front();
  if (first.size() > 1 && first[0] == '-') {
    const std::string name = first.substr(0, first.find('='));
    return absl::StrCat("unknown option '", name, "'", DidYouMean(name, OptionNames(cmd)));
  }
  if (cmd == root && !SubcommandNames(root).empty()) {
    return absl::StrCat("unknown command '", first, "'", DidYouMean(first, SubcommandNames(root)),
                        ": expected one of ", absl::StrJoin(SubcommandNames(root), ", "));
  }
  return absl::StrCat("unexpected argument '", first, "'");
}

// The arguments nobody took, wherever CLI11 left them.
std::vector<std::string> Leftovers(CLI::App* app) {
  std::vector<std::string> out = app->remaining(false);
  for (CLI::App* sub : app->get_subcommands()) {
    std::vector<std::string> more = Leftovers(sub);
    out.insert(out.end(), more.begin(), more.end());
  }
  return out;
}

// CLI11 (2.3) reads an unsigned option with strtoull, which takes "-3" as 2^64 - 3 and a
// number past 2^64 as 2^64 - 1: `--epoch-size -3` read for ever. Every unsigned option (CLI11
// names their type UINT) is given this check first: decimal digits only, within 64 bits
// (narrower types are range-checked by CLI11 itself).
CLI::Validator WholeNumber() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        uint64_t v = 0;
        const char* end = value.data() + value.size();
        const auto [at, ec] = std::from_chars(value.data(), end, v);
        if (!value.empty() && value[0] != '+' && ec == std::errc::result_out_of_range) {
          return absl::StrCat("'", value, "' is too large (at most 18446744073709551615)");
        }
        if (value.empty() || ec != std::errc() || at != end) {
          return absl::StrCat("expected a whole number (0, 1, 2, ...), got '", value, "'");
        }
        return std::string();
      },
      "", "whole number");
}

void CheckUnsignedOptions(CLI::App* app) {
  for (CLI::Option* opt : app->get_options()) {
    if (opt->get_type_name().rfind("UINT", 0) == 0) opt->check(WholeNumber());  // "UINT", "UINT:INT in [1 - 9]"
  }
  for (CLI::App* sub : app->get_subcommands([](const CLI::App*) { return true; })) CheckUnsignedOptions(sub);
}

}  // namespace

std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv) {
  CheckUnsignedOptions(&app);
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    CLI::App* cmd = ChosenCommand(&app);
    std::string what = e.what();
    const std::vector<std::string> extras = Leftovers(&app);
    if (!extras.empty()) {
      what = DescribeExtras(&app, cmd, extras);
    } else if (cmd == &app && app.get_require_subcommand_min() > 0 && app.get_subcommands().empty()) {
      what = absl::StrCat("a command is required: one of ", absl::StrJoin(SubcommandNames(&app), ", "));
    }
    // CLI11 messages may span lines; a log line must not.
    for (char& c : what) {
      if (c == '\n') c = ' ';
    }
    std::fprintf(stderr, "%s: %s; see '%s --help'\n", CommandPath(cmd).c_str(), what.c_str(), CommandPath(cmd).c_str());
    return kExitUsage;
  }
}

}  // namespace conveyor::cli
