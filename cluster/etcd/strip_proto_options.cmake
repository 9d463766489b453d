# cmake -DIN=<etcd .proto> -DOUT=<copy> -P strip_proto_options.cmake
#
# Copies one of etcd's .proto files (Debian's golang-etcd-server-dev) without what only Go needs:
# the gogoproto import and its file options (Go code-generation hints), and the google.api.http
# options with their import (the REST gateway's routes). Neither changes a message or the wire
# format, and leaving them out spares us compiling gogo.proto and googleapis for C++. Runs at
# build time into the build directory: the repository holds no copy of etcd's protos.
file(READ "${IN}" text)
string(REGEX REPLACE "import \"gogoproto/gogo.proto\";" "" text "${text}")
string(REGEX REPLACE "import \"google/api/annotations.proto\";" "" text "${text}")
string(REGEX REPLACE "option \\(gogoproto\\.[a-z_]+\\) = [a-z]+;" "" text "${text}")
# The http options nest one level (additional_bindings { ... }): remove the inner blocks first.
string(REGEX REPLACE "additional_bindings {[^{}]*}" "" text "${text}")
string(REGEX REPLACE "option \\(google\\.api\\.http\\) = {[^{}]*};" "" text "${text}")
if(text MATCHES "gogoproto|google\\.api")
  message(FATAL_ERROR "${IN}: an option this filter does not know is left; extend it")
endif()
file(WRITE "${OUT}" "${text}")
