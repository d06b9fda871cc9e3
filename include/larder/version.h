// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Which Larder this is.
#pragma once

#include "larder/export.h"

namespace larder {

// The version of this build of Larder, e.g. "0.1.0": the VERSION file at the root of the source
// tree, which every binary's --version and the Python module's __version__ report too.
LARDER_EXPORT const char* Version();

}  // namespace larder
