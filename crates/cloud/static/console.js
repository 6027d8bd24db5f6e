// The cyphonic cloud's console: confirmations before destructive forms, and copying a new
// token. Everything works without it but these two conveniences.
document.addEventListener('submit', (e) => {
  const message = e.target.getAttribute('data-confirm');
  if (message && !window.confirm(message)) e.preventDefault();
});
document.addEventListener('click', (e) => {
  const id = e.target.getAttribute && e.target.getAttribute('data-copy');
  if (!id) return;
  const text = document.getElementById(id).textContent;
  navigator.clipboard.writeText(text).then(() => { e.target.textContent = 'Copied'; });
});
