"""Agents asking from anywhere: one service layer (``sets``) under the HTTP
API (``http``), the MCP server (``mcp_server``) and the webhooks (``outbox``,
``webhooks``).  An agent is known by its bearer token (``auth``) and sees
only the sets it asked (``owner``)."""
