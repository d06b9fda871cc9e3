// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "bench/replay/replay_plot.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "common/env.h"

namespace larder::bench {
namespace {

// Gnuplot's single-quoted strings take no escapes except '' for a quote.
std::string Quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    out += c;
    if (c == '\'') out += '\'';
  }
  return out + "'";
}

}  // namespace

std::string HitRateGnuplotScript(const HitRatePlot& plot, const std::string& svg_path) {
  std::ostringstream script;
  script << "set terminal svg size 900,560 dynamic enhanced font 'sans,12' background rgb 'white'\n"
         << "set output " << Quote(svg_path) << "\n"
         << "set title " << Quote(plot.title) << " noenhanced\n"
         << "set xlabel 'pool capacity (MiB)'\n"
         << "set ylabel 'hit rate (% of block references)'\n"
         << "set key right bottom box\n"
         << "set grid\n"
         << "set yrange [0:*]\n"
         << "set xrange [0:*]\n";
  script << "plot ";
  for (size_t i = 0; i < plot.series.size(); ++i) {
    const HitRateSeries& series = plot.series[i];
    if (i > 0) script << ", \\\n     ";
    script << "'-' using 1:2 with " << (series.with_points ? "linespoints pt 7 ps 0.8" : "lines")
           << " lw 2" << (series.dashed ? " dt 2" : "") << " title " << Quote(series.title)
           << " noenhanced";
  }
  script << "\n";
  for (const HitRateSeries& series : plot.series) {
    for (const auto& [capacity_mib, rate] : series.points) {
      script << capacity_mib << " " << rate * 100 << "\n";
    }
    script << "e\n";
  }
  return script.str();
}

Status WriteHitRatePlot(const HitRatePlot& plot, const std::string& svg_path) {
  std::string script = HitRateGnuplotScript(plot, svg_path);
  // A script file rather than a pipe: a missing gnuplot then fails the exec, not our write with
  // SIGPIPE.
  std::string tmpdir = GetEnv("TMPDIR");
  std::string path = (tmpdir.empty() ? std::string("/tmp") : tmpdir) + "/larder-replay-XXXXXX";
  int fd = mkstemp(path.data());
  if (fd < 0) return ErrnoToStatus(errno, "mkstemp " + path);
  bool written = ::write(fd, script.data(), script.size()) == static_cast<ssize_t>(script.size());
  ::close(fd);
  if (!written) {
    ::unlink(path.c_str());
    return InternalError("cannot write the gnuplot script to " + path);
  }
  pid_t pid = fork();
  if (pid == 0) {
    execlp("gnuplot", "gnuplot", path.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  bool waited = pid > 0 && waitpid(pid, &status, 0) == pid;
  int wait_errno = errno;
  ::unlink(path.c_str());
  if (pid < 0) return ErrnoToStatus(wait_errno, "fork gnuplot");
  if (!waited) return ErrnoToStatus(wait_errno, "waitpid gnuplot");
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
    return FailedPreconditionError("gnuplot not found (Debian: apt-get install gnuplot-nox)");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return InternalError("gnuplot failed drawing '" + svg_path + "' (wait status " +
                         std::to_string(status) + ")");
  }
  return Status::Ok();
}

}  // namespace larder::bench
