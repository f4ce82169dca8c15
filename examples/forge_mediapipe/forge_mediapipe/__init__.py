"""An example third-party Forge plugin: MediaPipe's custom TFLite operators (see ``plugin``)."""
