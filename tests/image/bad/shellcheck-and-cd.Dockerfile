# expect: SC2045 DL3003
FROM debian:bookworm-slim
RUN cd /tmp && for f in $(ls /etc); do echo "$f"; done
