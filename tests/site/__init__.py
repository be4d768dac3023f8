"""Site: the rendered HTML, the browser pass, the editions, the PDF and the Colab twins."""
