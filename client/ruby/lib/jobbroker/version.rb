# frozen_string_literal: true

module Jobbroker
  VERSION = "0.1.0"
end
