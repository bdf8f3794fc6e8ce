"""The HTTP layer: quart-trio routes, msgspec wire types, error mapping and OpenAPI."""
