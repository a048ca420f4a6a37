# Makes one of etcd's .proto files compile with plain protoc: drops the gogoproto and
# google.api imports and options (Go code generation and the HTTP gateway, nothing on the
# wire) and points its imports at the stripped copies. Run as
#   cmake -DIN=<etcd .proto> -DOUT=<copy> -P strip_etcd_proto.cmake
file(READ "${IN}" text)
string(REGEX REPLACE "import \"gogoproto/gogo.proto\";" "" text "${text}")
string(REGEX REPLACE "import \"google/api/annotations.proto\";" "" text "${text}")
string(REGEX REPLACE "option \\(gogoproto\\.[a-z_]+\\) = [a-z]+;" "" text "${text}")
# One level of nesting: additional_bindings { ... }.
string(REGEX REPLACE "option \\(google\\.api\\.http\\) = {([^{}]*{[^{}]*})*[^{}]*};" "" text "${text}")
string(REGEX REPLACE "\\[\\(gogoproto\\.[^]]*\\]" "" text "${text}")
if(text MATCHES "gogoproto|google\\.api")
  message(FATAL_ERROR "${IN}: an option of gogoproto or google.api is left after stripping")
endif()
file(WRITE "${OUT}" "${text}")
