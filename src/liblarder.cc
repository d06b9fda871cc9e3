// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// liblarder holds the whole of the engine, the store client, the attach side of larder-client and
// the ground floor (static libraries, linked whole; see cmake/LarderInstall.cmake), and exports
// what include/larder declares with LARDER_EXPORT. This file only gives the shared library a
// source of its own.
