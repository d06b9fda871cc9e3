// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "larder/version.h"

namespace larder {

const char* Version() { return LARDER_VERSION_STRING; }

}  // namespace larder
