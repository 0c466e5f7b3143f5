# One image for the coordinator and for workers (the command differs):
#   docker build -t rsc .
#   docker run -p 8080:8080 -e RSC_REDIS_URL=redis://redis:6379 -e RSC_ADMIN_PASSWORD=... rsc
#   docker run -e RSC_COORDINATOR_URL=http://rsc:8080 -e RSC_REDIS_URL=redis://redis:6379 \
#              -v $PWD/app:/app -w /app rsc rsc worker billing:app
FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /opt/rsc
COPY pyproject.toml README.md LICENSE ./
COPY rsc ./rsc
RUN pip install '.[sync]' && useradd --system --uid 10001 rsc
USER 10001

# The coordinator: listens on all interfaces inside the container (protected mode still
# refuses anonymous members from other hosts: configure credentials, or RSC_INSECURE=true
# on a private network).
FROM base AS coordinator
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=2s CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz')"
CMD ["rsc", "serve", "--bind", "0.0.0.0:8080"]

# Workers: mount or copy the application and run `rsc worker module:app`.
FROM base AS worker
CMD ["rsc", "worker", "--help"]
