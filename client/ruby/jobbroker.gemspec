# frozen_string_literal: true

require_relative "lib/jobbroker/version"

Gem::Specification.new do |s|
  s.name = "jobbroker"
  s.version = Jobbroker::VERSION
  s.summary = "Ruby client of the jobbroker durable job broker (gRPC)"
  s.description = "Producer helpers and a streaming worker for jobbroker. The gRPC messages " \
                  "and stubs in lib/jobbroker/v1 are generated from proto/ before building."
  s.authors = ["jobbroker authors"]
  s.license = "Apache-2.0"
  s.required_ruby_version = ">= 3.1"
  # lib/jobbroker/v1/*_pb.rb must be generated first (see README.md); the gem ships them.
  s.files = Dir["lib/**/*.rb"] + ["README.md"]
  s.require_paths = ["lib"]
  # The versions Debian bookworm ships (ruby-grpc, ruby-google-protobuf).
  s.add_runtime_dependency "grpc", "~> 1.51"
  s.add_runtime_dependency "google-protobuf", "~> 3.21"
  s.add_development_dependency "grpc-tools", "~> 1.51"
  s.add_development_dependency "minitest", "~> 5.15"
end
