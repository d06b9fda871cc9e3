// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Hit rate against capacity, drawn with gnuplot (Debian package gnuplot-nox) into an SVG file.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "larder/status.h"

namespace larder::bench {

struct HitRateSeries {
  std::string title;                              // legend entry
  std::vector<std::pair<double, double>> points;  // (capacity in MiB, hit rate 0..1), by capacity
  bool with_points = false;                       // mark each measurement, not just the line
  bool dashed = false;
};

struct HitRatePlot {
  std::string title;
  std::vector<HitRateSeries> series;
};

// The gnuplot script that draws `plot` into `svg_path`, data inline.
std::string HitRateGnuplotScript(const HitRatePlot& plot, const std::string& svg_path);

// Runs gnuplot on that script. Errors: FailedPrecondition (gnuplot missing), Internal (it failed).
Status WriteHitRatePlot(const HitRatePlot& plot, const std::string& svg_path);

}  // namespace larder::bench
