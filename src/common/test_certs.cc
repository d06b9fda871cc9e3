// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "common/test_certs.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <memory>
#include <string_view>
#include <system_error>

namespace larder::testing {
namespace {

struct KeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct CertFree {
  void operator()(X509* p) const { X509_free(p); }
};
struct BioFree {
  void operator()(BIO* p) const { BIO_free(p); }
};
struct ExtensionFree {
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
};
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;
using Cert = std::unique_ptr<X509, CertFree>;

// The OpenSSL error queue as a Status (and the queue emptied), for a call that just failed.
Status OpenSslError(std::string_view what) {
  std::string message = "test certificates: " + std::string(what);
  char buffer[256];
  for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
    ERR_error_string_n(e, buffer, sizeof(buffer));
    message += std::string(": ") + buffer;
  }
  return InternalError(std::move(message));
}

Result<Key> NewKey() {
  Key key(EVP_EC_gen("P-256"));
  if (!key) return OpenSslError("generating a P-256 key");
  return key;
}

Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  std::unique_ptr<X509_EXTENSION, ExtensionFree> ext(
      X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str()));
  if (!ext || X509_add_ext(cert, ext.get(), -1) != 1) {
    return OpenSslError("adding extension " + std::string(OBJ_nid2sn(nid)) + " = " + value);
  }
  return Status();
}

// A certificate for `key` named `common_name`, signed by `issuer_key` (self-signed when `issuer`
// is null). `alt_names` (a subjectAltName value) is added when non-empty.
Result<Cert> NewCertificate(EVP_PKEY* key, const std::string& common_name, bool is_ca, X509* issuer,
                            EVP_PKEY* issuer_key, const std::string& alt_names) {
  Cert cert(X509_new());
  if (!cert) return OpenSslError("X509_new");
  uint8_t serial_bytes[16];
  if (RAND_bytes(serial_bytes, sizeof(serial_bytes)) != 1) return OpenSslError("RAND_bytes");
  serial_bytes[0] &= 0x7f;  // a positive serial number
  BIGNUM* serial = BN_bin2bn(serial_bytes, sizeof(serial_bytes), nullptr);
  bool serial_set =
      serial != nullptr && BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(cert.get())) != nullptr;
  BN_free(serial);
  if (!serial_set) return OpenSslError("setting the serial number");
  X509_NAME* name = X509_get_subject_name(cert.get());
  if (X509_set_version(cert.get(), 2) != 1 ||
      X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(cert.get()), 24 * 3600) == nullptr ||
      X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                                 reinterpret_cast<const unsigned char*>("Larder tests"), -1, -1,
                                 0) != 1 ||
      X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                 reinterpret_cast<const unsigned char*>(common_name.c_str()), -1,
                                 -1, 0) != 1 ||
      X509_set_pubkey(cert.get(), key) != 1) {
    return OpenSslError("filling in certificate " + common_name);
  }
  X509* signer = issuer != nullptr ? issuer : cert.get();
  if (X509_set_issuer_name(cert.get(), X509_get_subject_name(signer)) != 1) {
    return OpenSslError("setting the issuer of " + common_name);
  }
  if (is_ca) {
    LARDER_RETURN_IF_ERROR(
        AddExtension(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE"));
    LARDER_RETURN_IF_ERROR(
        AddExtension(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign"));
  } else {
    LARDER_RETURN_IF_ERROR(
        AddExtension(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE"));
    LARDER_RETURN_IF_ERROR(
        AddExtension(cert.get(), signer, NID_key_usage, "critical,digitalSignature"));
    LARDER_RETURN_IF_ERROR(
        AddExtension(cert.get(), signer, NID_ext_key_usage, "serverAuth,clientAuth"));
  }
  LARDER_RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_subject_key_identifier, "hash"));
  if (issuer != nullptr) {
    LARDER_RETURN_IF_ERROR(
        AddExtension(cert.get(), signer, NID_authority_key_identifier, "keyid:always"));
  }
  if (!alt_names.empty()) {
    LARDER_RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_subject_alt_name, alt_names));
  }
  if (X509_sign(cert.get(), issuer_key != nullptr ? issuer_key : key, EVP_sha256()) <= 0) {
    return OpenSslError("signing certificate " + common_name);
  }
  return cert;
}

// Writes `contents` to `path` (replacing it) with permissions `mode`.
Status WriteFile(const std::string& path, const std::string& contents, mode_t mode) {
  // Unlinking first makes `mode` apply even when an older file of that name exists.
  if (unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoToStatus(errno, "unlink " + path);
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return ErrnoToStatus(errno, "open " + path);
  size_t written = 0;
  while (written < contents.size()) {
    ssize_t n = write(fd, contents.data() + written, contents.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      close(fd);
      return ErrnoToStatus(err, "write " + path);
    }
    written += static_cast<size_t>(n);
  }
  if (close(fd) != 0) return ErrnoToStatus(errno, "close " + path);
  return Status();
}

// PEM text produced by `write` into a memory BIO.
template <typename WriteFn>
Result<std::string> ToPem(WriteFn write, std::string_view what) {
  std::unique_ptr<BIO, BioFree> bio(BIO_new(BIO_s_mem()));
  if (!bio || write(bio.get()) != 1) return OpenSslError("encoding " + std::string(what));
  char* data = nullptr;
  long len = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(len));
}

Status WriteCertificate(X509* cert, const std::string& path) {
  LARDER_ASSIGN_OR_RETURN(std::string pem,
                          ToPem([cert](BIO* b) { return PEM_write_bio_X509(b, cert); }, path));
  return WriteFile(path, pem, 0644);
}

Status WriteKey(EVP_PKEY* key, const std::string& path) {
  LARDER_ASSIGN_OR_RETURN(std::string pem, ToPem(
                                               [key](BIO* b) {
                                                 return PEM_write_bio_PrivateKey(
                                                     b, key, nullptr, nullptr, 0, nullptr, nullptr);
                                               },
                                               path));
  return WriteFile(path, pem, 0600);
}

}  // namespace

Result<TestCertificates> WriteTestCertificates(const std::string& dir,
                                               const std::vector<std::string>& ip_sans) {
  std::string alt_names = "DNS:localhost,IP:127.0.0.1";
  for (const std::string& ip : ip_sans) {
    in6_addr parsed;
    if (inet_pton(AF_INET, ip.c_str(), &parsed) != 1 &&
        inet_pton(AF_INET6, ip.c_str(), &parsed) != 1) {
      return InvalidArgumentError("test certificates: '" + ip + "' is not an IP address");
    }
    alt_names += ",IP:" + ip;
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return ErrnoToStatus(ec.value(), "creating directory " + dir);

  LARDER_ASSIGN_OR_RETURN(Key ca_key, NewKey());
  LARDER_ASSIGN_OR_RETURN(Cert ca, NewCertificate(ca_key.get(), "Larder test CA", /*is_ca=*/true,
                                                  nullptr, nullptr, ""));
  LARDER_ASSIGN_OR_RETURN(Key leaf_key, NewKey());
  LARDER_ASSIGN_OR_RETURN(Cert leaf, NewCertificate(leaf_key.get(), "localhost", /*is_ca=*/false,
                                                    ca.get(), ca_key.get(), alt_names));
  LARDER_ASSIGN_OR_RETURN(Key other_key, NewKey());
  LARDER_ASSIGN_OR_RETURN(Cert other, NewCertificate(other_key.get(), "Larder unrelated test CA",
                                                     /*is_ca=*/true, nullptr, nullptr, ""));

  TestCertificates out;
  out.ca_file = dir + "/ca.pem";
  out.cert_file = dir + "/cert.pem";
  out.key_file = dir + "/key.pem";
  out.other_ca_file = dir + "/other_ca.pem";
  LARDER_RETURN_IF_ERROR(WriteCertificate(ca.get(), out.ca_file));
  LARDER_RETURN_IF_ERROR(WriteCertificate(leaf.get(), out.cert_file));
  LARDER_RETURN_IF_ERROR(WriteKey(leaf_key.get(), out.key_file));
  LARDER_RETURN_IF_ERROR(WriteCertificate(other.get(), out.other_ca_file));
  return out;
}

}  // namespace larder::testing
