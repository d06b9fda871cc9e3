// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// LARDER_EXPORT marks what liblarder exports: the classes and functions these headers declare.
// Everything else in the library is compiled with hidden visibility (-fvisibility=hidden), so
// that the library's symbol table is its public API and nothing more.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define LARDER_EXPORT [[gnu::visibility("default")]]
#else
#define LARDER_EXPORT
#endif
