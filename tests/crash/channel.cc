#include "tests/crash/channel.h"

#include "absl/strings/str_split.h"

namespace jobbroker::crash {

std::shared_ptr<grpc::Channel> DialBroker(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

BrokerRing::BrokerRing(const std::string& addresses) {
  for (absl::string_view address : absl::StrSplit(addresses, ',', absl::SkipEmpty()))
    stubs_.push_back(v1::Broker::NewStub(DialBroker(std::string(address))));
  if (stubs_.empty()) stubs_.push_back(v1::Broker::NewStub(DialBroker(addresses)));
}

}  // namespace jobbroker::crash
