package dev.jobbroker.client;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * A throwaway CA, a broker certificate for 127.0.0.1 and a client certificate, made by the
 * openssl command line in {@code dir} (keys in PKCS#8, what both the broker and gRPC read).
 */
record TestCertificates(Path ca, Path serverCert, Path serverKey, Path clientCert, Path clientKey) {
  static TestCertificates make(Path dir) throws IOException, InterruptedException {
    Path ca = dir.resolve("ca.pem");
    Path caKey = dir.resolve("ca.key");
    openssl(dir, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", caKey.toString(),
        "-out", ca.toString(), "-days", "1", "-subj", "/CN=jobbroker test CA");
    Path serverExt = dir.resolve("server.ext");
    Files.writeString(serverExt, "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n");
    Path clientExt = dir.resolve("client.ext");
    Files.writeString(clientExt, "extendedKeyUsage=clientAuth\n");
    TestCertificates certs =
        new TestCertificates(
            ca,
            dir.resolve("server.pem"),
            dir.resolve("server.key"),
            dir.resolve("client.pem"),
            dir.resolve("client.key"));
    signed(dir, "server", "/CN=127.0.0.1", serverExt, ca, caKey, certs.serverCert, certs.serverKey);
    signed(dir, "client", "/CN=java-test-client", clientExt, ca, caKey, certs.clientCert,
        certs.clientKey);
    return certs;
  }

  private static void signed(Path dir, String name, String subject, Path ext, Path ca, Path caKey,
      Path cert, Path key) throws IOException, InterruptedException {
    Path csr = dir.resolve(name + ".csr");
    openssl(dir, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key.toString(),
        "-out", csr.toString(), "-subj", subject);
    openssl(dir, "x509", "-req", "-in", csr.toString(), "-CA", ca.toString(),
        "-CAkey", caKey.toString(), "-CAcreateserial", "-out", cert.toString(), "-days", "1",
        "-extfile", ext.toString());
  }

  private static void openssl(Path dir, String... args) throws IOException, InterruptedException {
    List<String> cmd = new java.util.ArrayList<>();
    cmd.add("openssl");
    cmd.addAll(List.of(args));
    Path log = dir.resolve("openssl.log");
    Process p =
        new ProcessBuilder(cmd)
            .directory(dir.toFile())
            .redirectErrorStream(true)
            .redirectOutput(ProcessBuilder.Redirect.appendTo(log.toFile()))
            .start();
    if (!p.waitFor(60, TimeUnit.SECONDS) || p.exitValue() != 0) {
      throw new IOException(
          "openssl " + String.join(" ", args) + " failed:\n" + Files.readString(log));
    }
  }
}
