# frozen_string_literal: true

# Built by test.sh (or `rake gem`), which first generates lib/jobbroker/v1/*_pb.rb from
# ../../proto and copies the repository's LICENSE and VERSION here: the gem ships all three,
# none of them is committed in this folder. The version is the repository's VERSION file.
here = __dir__
# In the repository, the root VERSION; a copy of it where this gemspec is not in the repository.
repository_version = File.join(here, "../../VERSION")
version_file = if File.directory?(File.join(here, "../../proto/jobbroker"))
                 repository_version
               else
                 File.join(here, "lib/jobbroker/VERSION")
               end
raise "jobbroker.gemspec: #{version_file} is missing" unless File.exist?(version_file)

generated = Dir.glob("lib/jobbroker/v1/*_pb.rb", base: here)
missing = %w[LICENSE lib/jobbroker/VERSION].reject { |f| File.exist?(File.join(here, f)) }
missing << "lib/jobbroker/v1/*_pb.rb" if generated.empty?
stale = File.exist?(File.join(here, "lib/jobbroker/VERSION")) &&
        File.read(File.join(here, "lib/jobbroker/VERSION")) != File.read(version_file)
missing << "an up-to-date lib/jobbroker/VERSION" if stale
# (Bundler reads this file for the Gemfile's `gemspec` before anything is generated: only a
# build needs them.)
unless missing.empty? || defined?(Bundler)
  raise "jobbroker.gemspec: #{missing.join(', ')} missing: build the gem with test.sh or " \
        "`rake gem`, which generate and copy them first"
end

Gem::Specification.new do |s|
  s.name = "jobbroker"
  s.version = File.read(version_file).strip
  s.summary = "Ruby client of the jobbroker durable job broker (gRPC): producer, worker, " \
              "ActiveJob adapter"
  s.description = "Producer and admin client, a streaming worker on Broker.Work, an ActiveJob " \
                  "adapter (queue_adapter = :jobbroker) and an in-memory test mode for " \
                  "jobbroker. Ships the gRPC messages and stubs generated from its protos."
  s.authors = ["jobbroker authors"]
  s.license = "Apache-2.0"
  s.required_ruby_version = ">= 3.1"
  s.files = Dir.glob(%w[lib/**/*.rb lib/jobbroker/VERSION exe/* LICENSE README.md], base: here).sort
  s.bindir = "exe"
  s.executables = ["jobbroker-activejob"]
  s.require_paths = ["lib"]
  # The versions Debian bookworm ships (ruby-grpc, ruby-google-protobuf). ActiveJob is optional:
  # only `require "jobbroker/active_job"` needs it (Debian: ruby-activejob, 6.1).
  s.add_runtime_dependency "grpc", "~> 1.51"
  s.add_runtime_dependency "google-protobuf", "~> 3.21"
  s.add_development_dependency "grpc-tools", "~> 1.51"
  s.add_development_dependency "minitest", "~> 5.15"
  s.add_development_dependency "activejob", ">= 6.1"
end
