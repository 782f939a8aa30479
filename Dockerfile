# askwright-bridge in a container.  See docs/operators.md.
#
#   docker build -t askwright-bridge .
#   docker run -d --name askwright-bridge --restart on-failure -v /srv/askwright:/data askwright-bridge
#
# /data holds config.yaml (readable by uid 10001), the store and the sets; in
# the config, store.path "./bridge.sqlite" and sets.root "./sets" (relative
# paths are relative to the config file).  Other commands run the same way:
#   docker exec askwright-bridge askwright-bridge status -c /data/config.yaml

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Only what the package is built from (.dockerignore keeps the rest out).
WORKDIR /src
COPY pyproject.toml README.md config.example.yaml ./
COPY bridge ./bridge
COPY schemas ./schemas
COPY examples ./examples
# A plain wheel carries the schemas and examples, so the source can go.
RUN pip install --no-cache-dir . \
    && cd / && rm -rf /src \
    && useradd --system --uid 10001 --user-group --home-dir /data --no-create-home \
       --shell /usr/sbin/nologin askwright \
    && mkdir -p /data && chown askwright:askwright /data

USER askwright
WORKDIR /data
VOLUME /data
# metrics.listen "0.0.0.0:9464" for /metrics and /health from outside the
# container; appservice.listen "0.0.0.0:29331" in appservice mode.
EXPOSE 9464 29331
# SIGTERM (docker stop) finishes what is in flight and exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["askwright-bridge"]
CMD ["run", "-c", "/data/config.yaml"]
