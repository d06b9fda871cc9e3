// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The generated test certificates chain to their CA and not to the unrelated one, the key matches,
// and the subject alternative names hold what the header promises.
#include "common/test_certs.h"

#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

namespace larder::testing {
namespace {

struct CertFree {
  void operator()(X509* p) const { X509_free(p); }
};
using Cert = std::unique_ptr<X509, CertFree>;

Cert LoadCertificate(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return nullptr;
  Cert cert(PEM_read_X509(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  return cert;
}

// X509_V_OK when `leaf` chains to `ca`, else the verification error.
int Verify(X509* leaf, X509* ca) {
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca);
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  X509_STORE_CTX_init(ctx, store, leaf, nullptr);
  int rc = X509_verify_cert(ctx);
  int error = rc == 1 ? X509_V_OK : X509_STORE_CTX_get_error(ctx);
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  return error;
}

class TestCertsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "larder-test-certs-XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
};

TEST_F(TestCertsTest, CertificateChainsToItsCaOnly) {
  auto certs = WriteTestCertificates(dir_ + "/nested", {"10.1.2.3", "::1"});
  ASSERT_TRUE(certs.ok()) << certs.status();
  Cert ca = LoadCertificate(certs->ca_file);
  Cert leaf = LoadCertificate(certs->cert_file);
  Cert other = LoadCertificate(certs->other_ca_file);
  ASSERT_TRUE(ca && leaf && other);
  EXPECT_EQ(Verify(leaf.get(), ca.get()), X509_V_OK);
  EXPECT_NE(Verify(leaf.get(), other.get()), X509_V_OK);

  FILE* f = std::fopen(certs->key_file.c_str(), "r");
  ASSERT_NE(f, nullptr);
  EVP_PKEY* key = PEM_read_PrivateKey(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  ASSERT_NE(key, nullptr);
  EXPECT_EQ(X509_check_private_key(leaf.get(), key), 1);
  EVP_PKEY_free(key);
  struct stat st;
  ASSERT_EQ(stat(certs->key_file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  EXPECT_EQ(X509_check_host(leaf.get(), "localhost", 0, 0, nullptr), 1);
  EXPECT_EQ(X509_check_ip_asc(leaf.get(), "127.0.0.1", 0), 1);
  EXPECT_EQ(X509_check_ip_asc(leaf.get(), "10.1.2.3", 0), 1);
  EXPECT_EQ(X509_check_ip_asc(leaf.get(), "::1", 0), 1);
  EXPECT_NE(X509_check_ip_asc(leaf.get(), "10.1.2.4", 0), 1);
}

TEST_F(TestCertsTest, EveryCallMakesANewCa) {
  auto first = WriteTestCertificates(dir_ + "/a");
  auto second = WriteTestCertificates(dir_ + "/b");
  ASSERT_TRUE(first.ok() && second.ok());
  Cert leaf = LoadCertificate(first->cert_file);
  Cert ca = LoadCertificate(second->ca_file);
  ASSERT_TRUE(leaf && ca);
  EXPECT_NE(Verify(leaf.get(), ca.get()), X509_V_OK);
}

TEST_F(TestCertsTest, BadIpSanIsInvalidArgument) {
  auto certs = WriteTestCertificates(dir_, {"not-an-ip"});
  EXPECT_EQ(certs.status().code(), StatusCode::kInvalidArgument) << certs.status();
}

}  // namespace
}  // namespace larder::testing
