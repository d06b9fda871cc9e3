// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// liblarder_store holds the objects of the static store client and attach libraries: this file
// only gives the shared library a source of its own (see cmake/LarderInstall.cmake).
