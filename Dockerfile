# oasr demo server: CPU image with the bundled default model, serving on port 8000.
#   docker compose up                      (CPU)
#   docker compose -f docker-compose.yml -f docker-compose.gpu.yml up   (NVIDIA GPU)
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The torch build: CPU wheels by default; the GPU compose file passes a CUDA wheel index.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install torch==2.13.0 --index-url "${TORCH_INDEX_URL}"

WORKDIR /app
COPY pyproject.toml README.md ./
COPY oasr ./oasr
COPY backend ./backend
COPY frontend ./frontend
# The CPU beam search is compiled once here, into a numba cache the server's user owns, so
# the server does not compile it (several seconds) at start.
ENV NUMBA_CACHE_DIR=/app/.numba-cache
RUN pip install . \
    && python -c "from oasr.decoding.compiled_search import ensure_compiled; ensure_compiled()" \
    && useradd --create-home --uid 1000 oasr \
    && chown -R oasr /app/.numba-cache
# The page is not part of the installed packages: serve it from the copy above.
ENV OASR_FRONTEND_DIR=/app/frontend

USER oasr
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
CMD ["oasr-server", "--host", "0.0.0.0", "--port", "8000"]
