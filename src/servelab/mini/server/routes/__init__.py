"""The server's routes, one module per API family; each `routes(state)` returns an APIRouter
whose handlers read the ServerState given to it."""
