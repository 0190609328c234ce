"""The HTTP side: routes (thin, one module per resource), the error handler, body reading and the OpenAPI
schema. Everything here speaks HTTP; the work is the data plane's (:mod:`service.dataplane`)."""
