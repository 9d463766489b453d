// faults_power_loss --root DIR --journal FILE: what a power cut does to DIR's files, run after
// the process that wrote them is dead (README.md). Every regular file under DIR keeps the bytes
// it had at its last fsync (the journal's last line for its device and inode) and loses the
// rest; a file never synced since it was created or truncated is emptied.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>

namespace {

int Usage(const std::string& why) {
  std::fprintf(stderr,
               "faults_power_loss: %s\nusage: faults_power_loss --root DIR --journal FILE\n",
               why.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string root, journal;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--root") {
      root = argv[i + 1];
    } else if (flag == "--journal") {
      journal = argv[i + 1];
    } else {
      return Usage("unknown flag " + flag);
    }
  }
  if (root.empty() || journal.empty() || argc % 2 == 0) return Usage("both flags are needed");

  // (dev, ino) -> size at its last sync. A journal that does not exist: nothing was synced.
  std::map<std::pair<unsigned long long, unsigned long long>, long long> synced;
  std::ifstream in(journal);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    unsigned long long dev = 0, ino = 0;
    long long size = 0;
    if (fields >> dev >> ino >> size) synced[{dev, ino}] = size;  // a torn last line: skipped
  }

  long long files = 0, truncated = 0, dropped = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(root, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    const std::string path = it->path().string();
    struct stat st;
    if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    ++files;
    auto at = synced.find(
        {static_cast<unsigned long long>(st.st_dev), static_cast<unsigned long long>(st.st_ino)});
    const long long keep = at == synced.end() ? 0 : at->second;
    if (st.st_size <= keep) continue;
    if (truncate(path.c_str(), keep) != 0) {
      std::perror(("truncate " + path).c_str());
      return 2;
    }
    ++truncated;
    dropped += st.st_size - keep;
  }
  if (ec) return Usage(root + ": " + ec.message());
  std::printf("power loss in %s: %lld files, %lld truncated, %lld unsynced bytes dropped\n",
              root.c_str(), files, truncated, dropped);
  return 0;
}
