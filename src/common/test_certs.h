// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Test-only: throw-away X.509 material for TLS tests, generated with OpenSSL's API (no openssl
// binary, no files checked into the tree). Built only with the tests (target larder_test_certs).
// Thread-safe: every call generates fresh keys and writes its own files.
#pragma once

#include <string>
#include <vector>

#include "larder/status.h"

namespace larder::testing {

// Paths of the PEM files written by WriteTestCertificates.
struct TestCertificates {
  std::string ca_file;        // PEM CA certificate
  std::string cert_file;      // PEM certificate signed by the CA: CN=localhost, SAN DNS:localhost,
                              // IP:127.0.0.1 and every ip in `ip_sans`
  std::string key_file;       // PEM private key of cert_file
  std::string other_ca_file;  // an unrelated CA (certificates above do not chain to it)
};

// Generates a fresh CA, a server/client certificate and key signed by it, and an unrelated CA with
// OpenSSL's API into `dir` (created if missing; existing files of the same names are replaced).
// Keys are ECDSA P-256, signatures SHA-256, validity from one hour ago for one day; the leaf
// certificate is usable for both TLS server and client authentication. The key file is mode 0600.
// InvalidArgument when an entry of `ip_sans` is not an IPv4 or IPv6 address; an errno-derived or
// Internal status when `dir` cannot be created or OpenSSL fails.
Result<TestCertificates> WriteTestCertificates(const std::string& dir,
                                               const std::vector<std::string>& ip_sans = {});

}  // namespace larder::testing
