#include "server/observability/process_metrics.h"

#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace jobbroker::server {
namespace {

prometheus::MetricFamily Gauge(const char* name, const char* help, double value,
                               prometheus::MetricType type = prometheus::MetricType::Gauge) {
  prometheus::MetricFamily f{name, help, type, {}};
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(std::move(m));
  return f;
}

}  // namespace

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  std::vector<prometheus::MetricFamily> out;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  // /proc/self/stat: the fields after the command name, whose parentheses may hold spaces.
  std::ifstream stat_file("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  size_t close = stat.rfind(')');
  if (close != std::string::npos) {
    std::istringstream fields(stat.substr(close + 2));
    std::string f[22];
    for (std::string& v : f) fields >> v;
    // f[0] is field 3 (state), so utime (14) is f[11], stime (15) f[12], starttime (22) f[19]
    // and rss (24, in pages) f[21].
    double utime = std::stod(f[11]), stime = std::stod(f[12]);
    double start_ticks = std::stod(f[19]);
    double rss_pages = std::stod(f[21]);
    std::ifstream uptime_file("/proc/uptime");
    double uptime = 0;
    uptime_file >> uptime;
    const double boot = static_cast<double>(time(nullptr)) - uptime;
    out.push_back(Gauge("process_cpu_seconds_total", "User and system CPU time spent, in seconds.",
                        (utime + stime) / ticks, prometheus::MetricType::Counter));
    out.push_back(Gauge("process_start_time_seconds",
                        "Start time of the process since the Unix epoch, in seconds.",
                        boot + start_ticks / ticks));
    out.push_back(Gauge("process_resident_memory_bytes", "Resident memory size, in bytes.",
                        rss_pages * page));
  }
  int fds = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (readdir(dir) != nullptr) ++fds;
    closedir(dir);
    fds -= 3;  // ".", ".." and the directory's own descriptor
  }
  out.push_back(Gauge("process_open_fds", "Open file descriptors.", fds));
  return out;
}

}  // namespace jobbroker::server
