// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Runs a fuzz target's LLVMFuzzerTestOneInput over files, without libFuzzer: every file named on
// the command line, and every file in every directory named there (a missing directory is
// skipped: a target may have no regressions yet). Builds with any compiler, so that the test
// build replays each target's seed corpus and past crashes under its sanitizers. Exits 0 when
// every input ran; an input that breaks the target aborts the process, naming it first.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

bool RunFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    return false;
  }
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::fprintf(stderr, "input %s (%zu bytes)\n", path.c_str(), bytes.size());
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  size_t inputs = 0;
  bool ok = true;
  for (int i = 1; i < argc; ++i) {
    std::filesystem::path arg(argv[i]);
    std::error_code error;
    if (std::filesystem::is_directory(arg, error)) {
      std::vector<std::filesystem::path> files;
      for (const auto& entry : std::filesystem::directory_iterator(arg)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
      std::sort(files.begin(), files.end());
      for (const auto& file : files) {
        ok = RunFile(file) && ok;
        ++inputs;
      }
    } else if (std::filesystem::exists(arg, error)) {
      ok = RunFile(arg) && ok;
      ++inputs;
    }
  }
  std::fprintf(stderr, "%zu inputs replayed\n", inputs);
  if (inputs == 0) {
    std::fprintf(stderr, "no inputs: give corpus directories or files\n");
    return 1;
  }
  return ok ? 0 : 1;
}
