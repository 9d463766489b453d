# expect: DL3049 DL3050
FROM debian:bookworm-slim
LABEL org.opencontainers.image.title="jobbroker" \
      maintainer-email="someone"
CMD ["bash"]
