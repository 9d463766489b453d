# expect: DL3007 DL3015 DL3009
FROM debian:latest
RUN apt-get update && apt-get install -y curl
