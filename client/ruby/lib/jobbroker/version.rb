# frozen_string_literal: true

module Jobbroker
  # The one version of jobbroker, the broker's and every client's: the repository's root file
  # VERSION, read where this file runs in the repository (client/ruby/lib); an installed gem
  # reads the copy beside this file that test.sh and `rake gem` put there before `gem build`.
  VERSION = begin
    root = File.expand_path("../../../..", __dir__)
    in_repository = File.directory?(File.join(root, "proto", "jobbroker"))
    path = in_repository ? File.join(root, "VERSION") : File.expand_path("VERSION", __dir__)
    File.read(path).strip
  rescue Errno::ENOENT
    raise LoadError, "jobbroker: the VERSION file #{path} is missing"
  end
end
