# expect: DL3002 DL3025 DL3020
FROM debian:bookworm-slim
ADD jobbroker /usr/local/bin/jobbroker
USER 10001
USER root
CMD jobbroker --data-dir /data
