// Placeholder console (replaced by the real one): logs in and says so.
const form = document.getElementById("login-form");
const message = document.getElementById("message");
form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const token = document.getElementById("token").value;
  const reply = await fetch("/ui/login", {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ token }),
  });
  message.textContent = reply.ok ? "Logged in." : "Wrong token.";
  if (reply.ok) {
    message.id = "logged-in";
  }
});
